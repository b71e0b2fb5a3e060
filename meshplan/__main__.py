from meshplan.cli import main

main()
