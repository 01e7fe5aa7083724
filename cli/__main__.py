from urewrite.commands import main

main(prog_name="urewrite")
