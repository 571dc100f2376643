import sys

from collc.cli import main

sys.exit(main())
