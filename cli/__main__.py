from urewrite.commands import run

run()
