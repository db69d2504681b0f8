from cosim.cli import run

run()
