from vpatch.cli import main

main()
