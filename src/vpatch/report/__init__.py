"""How results are shown: tables, lines and JSON for the CLI to print. Nothing here prints."""
