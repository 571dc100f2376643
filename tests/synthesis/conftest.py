import sys
from pathlib import Path

# topos.py (test topologies) is imported as a top-level module.
sys.path.insert(0, str(Path(__file__).resolve().parent))
