// A real OpenID provider (oidc-provider, certified) for SendDock's single sign-on tests.
//
//   node server.mjs PORT   (env: CLIENT_ID, CLIENT_SECRET, REDIRECT_URI)
//
// Any login works on its sign-in form (oidc-provider's development interactions). The login
// is "email#group1,group2#mode": the ID token carries the email and the groups claim; a
// mode makes the provider answer the token request with a broken ID token, signed by its
// own key unless said otherwise: "wrong-aud" (issued to another client), "expired" (expired
// an hour ago), "bad-sig" (signed by a key that is not in its JWKS).
// Prints "ready ISSUER" on stdout once it listens on 127.0.0.1:PORT.
import { SignJWT, decodeJwt, exportJWK, generateKeyPair } from 'jose';
import Provider from 'oidc-provider';

const port = Number(process.argv[2]);
const issuer = `http://127.0.0.1:${port}`;
const { privateKey, publicKey } = await generateKeyPair('RS256', { extractable: true });
const jwk = { ...(await exportJWK(privateKey)), kid: 'harness-1', alg: 'RS256', use: 'sig' };
const impostor = (await generateKeyPair('RS256')).privateKey;
void publicKey;

function parse(login) {
  const [email, groups = '', mode = ''] = String(login).split('#');
  return { email, groups: groups ? groups.split(',') : [], mode };
}

const provider = new Provider(issuer, {
  clients: [{
    client_id: process.env.CLIENT_ID,
    client_secret: process.env.CLIENT_SECRET,
    redirect_uris: [process.env.REDIRECT_URI],
    grant_types: ['authorization_code'],
    response_types: ['code'],
  }],
  jwks: { keys: [jwk] },
  cookies: { keys: ['senddock-harness-cookie-key'] },
  pkce: { required: () => true },
  claims: { openid: ['sub'], email: ['email', 'email_verified'], groups: ['groups'] },
  scopes: ['openid', 'email', 'groups'],
  conformIdTokenClaims: false,  // the claims go in the ID token (no userinfo call needed)
  async findAccount(ctx, id) {
    const { email, groups } = parse(id);
    return {
      accountId: id,
      async claims() { return { sub: id, email, email_verified: true, groups }; },
    };
  },
});

provider.use(async (ctx, next) => {
  await next();
  if (ctx.path !== '/token' || !ctx.body || typeof ctx.body !== 'object' || !ctx.body.id_token) {
    return;
  }
  const payload = decodeJwt(ctx.body.id_token);
  const { mode } = parse(payload.sub);
  const now = Math.floor(Date.now() / 1000);
  let key = privateKey;
  // Issued to another client, naming this one as its authorized party: only the
  // audience check refuses it.
  if (mode === 'wrong-aud') Object.assign(payload, { aud: 'another-client', azp: process.env.CLIENT_ID });
  else if (mode === 'expired') Object.assign(payload, { iat: now - 7200, exp: now - 3600 });
  else if (mode === 'bad-sig') key = impostor;
  else return;
  ctx.body.id_token = await new SignJWT(payload)
    .setProtectedHeader({ alg: 'RS256', kid: jwk.kid, typ: 'JWT' }).sign(key);
});

provider.listen(port, '127.0.0.1', () => { process.stdout.write(`ready ${issuer}\n`); });
