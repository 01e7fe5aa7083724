from urewrite.entry import run

run()
