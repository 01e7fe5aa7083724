from urewrite.cli import main

main()
