"""The smtp-sink itself: recording, scripted replies, rules reload, robustness, CLI."""

from __future__ import annotations

import json
import os
import signal
import smtplib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from webapp.sink import SinkServer, read_records

RAW = (
    b"From: a@example.com\r\n"
    b"To: b@example.com\r\n"
    b"Subject: =?utf-8?b?R3LDvMOfZQ==?= and\r\n more\r\n"
    b"Message-ID: <42.x@example.com>\r\n"
    b"\r\n"
    b".leading dot\r\n"
    b"..two dots\r\n"
    b".\r\n"
    b"end\r\n"
)


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[SinkServer]:
    with SinkServer(record_path=tmp_path / "sink.jsonl") as server:
        yield server


def smtp_client(port: int) -> smtplib.SMTP:
    return smtplib.SMTP("127.0.0.1", port, local_hostname="test", timeout=5)


def test_port_zero_picks_a_free_port(sink: SinkServer) -> None:
    assert sink.port > 0
    with socket.create_connection(("127.0.0.1", sink.port), timeout=5) as conn:
        assert conn.recv(100).startswith(b"220 ")


def test_record_fields_and_dot_transparency(sink: SinkServer) -> None:
    with smtp_client(sink.port) as client:
        client.sendmail("a@example.com", ["b@example.com", "C@Example.com"], RAW)
    [record] = sink.records()
    assert set(record) == {"time", "started", "mail_from", "rcpt_tos", "message_id", "subject",
                           "size"}
    assert record["mail_from"] == "a@example.com"
    assert record["rcpt_tos"] == ["b@example.com", "C@Example.com"]
    assert record["message_id"] == "<42.x@example.com>"
    assert record["subject"] == "Grüße and more"
    assert record["size"] == len(RAW)  # dot-stuffing undone exactly
    assert record["time"].endswith("+00:00")


def test_empty_and_odd_messages(sink: SinkServer) -> None:
    with smtp_client(sink.port) as client:
        client.sendmail("a@example.com", ["b@example.com"], b"")
        client.sendmail("a@example.com", ["b@example.com"], b"no headers at all")
        client.sendmail("<>", ["b@example.com"], b"Subject: bounce\r\n\r\nx\r\n")
    records = sink.records()
    assert [r["subject"] for r in records] == [None, None, "bounce"]
    assert records[2]["mail_from"] == "<>"  # the null sender, as aiosmtpd reports it


def test_scripted_replies_and_rejection_lines(tmp_path: Path) -> None:
    rules = {
        "rules": [
            {"match": "hard-*@example.com", "reply": "550 5.1.1 User unknown", "stage": "rcpt"},
            {"match": "after-*@example.com", "reply": "554 5.6.0 No thanks", "stage": "data"},
            {
                "match": "blocked@sender.example",
                "reply": "553 5.7.1 Sender refused",
                "stage": "mail",
            },
        ]
    }
    with (
        SinkServer(record_path=tmp_path / "r.jsonl", rules=rules) as sink,
        smtp_client(sink.port) as client,
    ):
        refused = client.sendmail("a@example.com", ["ok@example.com", "HARD-1@example.com"], RAW)
        assert refused == {"HARD-1@example.com": (550, b"5.1.1 User unknown")}
        with pytest.raises(smtplib.SMTPDataError) as data_error:
            client.sendmail("a@example.com", ["after-1@example.com"], RAW)
        assert data_error.value.smtp_code == 554
        with pytest.raises(smtplib.SMTPSenderRefused):
            client.sendmail("blocked@sender.example", ["ok@example.com"], RAW)
        assert [r["rcpt_tos"] for r in sink.records()] == [["ok@example.com"]]
        rejected = {r["stage"]: r["rejected"] for r in sink.rejections()}
        assert rejected == {
            "rcpt": "550 5.1.1 User unknown",
            "data": "554 5.6.0 No thanks",
            "mail": "553 5.7.1 Sender refused",
        }


def test_times_counts_per_address(tmp_path: Path) -> None:
    rules = {"rules": [{"match": "soft-*@example.com", "reply": "451 4.3.0 Later", "times": 2}]}
    with (
        SinkServer(record_path=tmp_path / "r.jsonl", rules=rules) as sink,
        smtp_client(sink.port) as client,
    ):
        client.ehlo()
        codes = []
        for address in ["soft-1@example.com"] * 3 + ["soft-2@example.com"]:
            client.mail("a@example.com")
            codes.append(client.rcpt(address)[0])
            client.rset()
        assert codes == [451, 451, 250, 451]


def test_421_closes_the_connection(tmp_path: Path) -> None:
    rules = {"rules": [{"match": "*", "reply": "421 4.7.0 Going down", "stage": "mail"}]}
    with SinkServer(record_path=tmp_path / "r.jsonl", rules=rules) as sink:
        client = smtp_client(sink.port)
        client.ehlo()
        assert client.mail("a@example.com")[0] == 421
        with pytest.raises(smtplib.SMTPServerDisconnected):
            client.noop()


def test_auth_plain_and_login(tmp_path: Path) -> None:
    rules = {"auth": {"username": "u", "password": "p w"}}
    with SinkServer(record_path=tmp_path / "r.jsonl", rules=rules) as sink:
        for mechanism in ("PLAIN", "LOGIN"):
            with smtp_client(sink.port) as client:
                client.ehlo()
                auth_object = getattr(client, f"auth_{mechanism.lower()}")
                client.user, client.password = "u", "p w"
                assert client.auth(mechanism, auth_object)[0] == 235
                client.sendmail("a@example.com", ["b@example.com"], RAW)
        with smtp_client(sink.port) as client:
            with pytest.raises(smtplib.SMTPAuthenticationError) as caught:
                client.login("u", "wrong")
            assert caught.value.smtp_code == 535
            assert caught.value.smtp_error.startswith(b"5.7.8")
        with smtp_client(sink.port) as client:
            client.ehlo()
            assert client.mail("a@example.com")[0] == 530
        assert len(sink.records()) == 2


def test_rules_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    rules_path = tmp_path / "rules.json"
    rules_path.write_text(
        json.dumps({"rules": [{"match": "*", "reply": "421 4.3.2 Down", "stage": "mail"}]})
    )
    with SinkServer(record_path=tmp_path / "r.jsonl", rules_path=rules_path) as sink:
        with smtp_client(sink.port) as client:
            client.ehlo()
            assert client.mail("a@example.com")[0] == 421
        rules_path.write_text(json.dumps({"rules": []}))
        with smtp_client(sink.port) as client:
            client.sendmail("a@example.com", ["b@example.com"], RAW)
        assert len(sink.records()) == 1


def test_client_vanishing_mid_data_does_not_hurt(sink: SinkServer) -> None:
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", sink.port), timeout=5) as conn:
            stream = conn.makefile("rwb")
            stream.readline()
            for command in (b"EHLO x", b"MAIL FROM:<a@example.com>", b"RCPT TO:<b@example.com>"):
                stream.write(command + b"\r\n")
                stream.flush()
                while stream.readline()[3:4] == b"-":
                    pass
            stream.write(b"DATA\r\n")
            stream.flush()
            assert stream.readline().startswith(b"354")
            stream.write(b"Subject: half\r\n\r\nhalf a messa")
            stream.flush()
            stream.close()
            conn.shutdown(socket.SHUT_RDWR)
    with smtp_client(sink.port) as client:
        client.sendmail("a@example.com", ["b@example.com"], RAW)
    assert len(sink.records()) == 1


def test_stop_drops_live_connections(tmp_path: Path) -> None:
    sink = SinkServer(record_path=tmp_path / "r.jsonl")
    sink.start()
    client = smtp_client(sink.port)
    client.ehlo()
    sink.stop()
    with pytest.raises(smtplib.SMTPServerDisconnected):
        client.noop()


def test_read_records_skips_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"mail_from": "a"}\n{"mail_fr')
    assert read_records(path) == [{"mail_from": "a"}]


def test_bad_rules_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="stage"):
        SinkServer(
            record_path=tmp_path / "r.jsonl",
            rules={"rules": [{"match": "*", "reply": "550 x", "stage": "ehlo"}]},
        )
    with pytest.raises(ValueError, match="3-digit"):
        SinkServer(
            record_path=tmp_path / "r.jsonl", rules={"rules": [{"match": "*", "reply": "nope"}]}
        )


# -- the command -------------------------------------------------------------


def run_sink(*args: str) -> subprocess.Popen[str]:
    code = "from webapp.sink import smtp_sink_command; smtp_sink_command()"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow  # starts a process
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_command_announces_records_and_exits_cleanly(tmp_path: Path, signum: int) -> None:
    record = tmp_path / "out.jsonl"
    rules = tmp_path / "rules.json"
    rules.write_text(
        json.dumps({"rules": [{"match": "hard@example.com", "reply": "550 5.1.1 Nope"}]})
    )
    process = run_sink("--port", "0", "--record", str(record), "--rules", str(rules))
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line.startswith("smtp-sink listening on 127.0.0.1:")
        port = int(line.rsplit(":", 1)[1])
        with smtp_client(port) as client:
            refused = client.sendmail("a@example.com", ["b@example.com", "hard@example.com"], RAW)
        assert list(refused) == ["hard@example.com"]
        entries = read_records(record)
        assert [("rejected" in e, e["rcpt_tos"]) for e in entries] == [
            (True, ["hard@example.com"]),
            (False, ["b@example.com"]),
        ]
    finally:
        os.kill(process.pid, signum)
        _out, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    assert "hard@example.com" in err  # not --quiet: each message is echoed to stderr


@pytest.mark.slow  # starts a process
def test_command_rejects_a_bad_rules_file(tmp_path: Path) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text("{not json")
    process = run_sink("--port", "0", "--rules", str(rules), "--record", str(tmp_path / "r"))
    _out, err = process.communicate(timeout=10)
    assert process.returncode == 2
    assert "rules" in err


@pytest.mark.slow  # starts a process
def test_command_reports_a_busy_port(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        process = run_sink("--port", str(port), "--record", str(tmp_path / "r"), "--quiet")
        _out, err = process.communicate(timeout=10)
    assert process.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in err


def test_sink_keeps_up(sink: SinkServer) -> None:
    """A smoke check of the bulk DATA path (no timing assertion)."""
    body = b"Subject: bulk\r\n\r\n" + b"Lorem ipsum dolor sit amet\r\n" * 200
    started = time.perf_counter()
    with smtp_client(sink.port) as client:
        for i in range(200):
            client.sendmail("a@example.com", [f"u{i}@example.com"], body)
    assert len(sink.records()) == 200
    assert all(r["size"] == len(body) for r in sink.records())
    assert time.perf_counter() - started < 60
