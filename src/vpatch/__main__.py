from vpatch.commands.cli import main

main()
