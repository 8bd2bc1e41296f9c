#!/usr/bin/env python3
"""Fails when tests/topology/data/ differs from what make_machines.py writes (edit the script,
then run it: tests/topology/make_machines.py)."""

import filecmp
import os
import subprocess
import sys
import tempfile

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
with tempfile.TemporaryDirectory() as out:
    subprocess.run([sys.executable, os.path.join(here, 'make_machines.py'), out], check=True)
    stale = [name for name in sorted(os.listdir(out))
             if not os.path.exists(os.path.join(here, 'data', name)) or
             not filecmp.cmp(os.path.join(out, name), os.path.join(here, 'data', name),
                             shallow=False)]
if stale:
    print('tests/topology/data/ is not what make_machines.py writes: %s; run '
          'tests/topology/make_machines.py' % ', '.join(stale))
    sys.exit(1)
print('tests/topology/data/ matches make_machines.py')
