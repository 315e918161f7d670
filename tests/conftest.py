import os
import sys

# Tests share helpers (tests/toys.py) by plain import.
sys.path.insert(0, os.path.dirname(__file__))
