from webapp.cli import main

main()
