from collc.cli import run

run()
