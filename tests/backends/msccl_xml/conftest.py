import sys
from pathlib import Path

# The schedule builders next to these tests are imported as a top-level module.
sys.path.insert(0, str(Path(__file__).resolve().parent))
