#!/usr/bin/env python3
"""Fails when tests/topology/data/ differs from what make_machines.py writes (edit the script,
then run it: tests/topology/make_machines.py)."""

import filecmp
import os
import subprocess
import sys
import tempfile

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
def files(top):
    out = set()
    for d, _, names in os.walk(top):
        out.update(os.path.relpath(os.path.join(d, n), top) for n in names)
    return out


with tempfile.TemporaryDirectory() as out:
    subprocess.run([sys.executable, os.path.join(here, 'make_machines.py'), out], check=True)
    data = os.path.join(here, 'data')
    made = files(out)
    stale = sorted(n for n in made if n not in files(data) or
                   not filecmp.cmp(os.path.join(out, n), os.path.join(data, n), shallow=False))
    stale += sorted(n + ' (not written by the script)' for n in files(data) - made)
if stale:
    print('tests/topology/data/ is not what make_machines.py writes: %s; run '
          'tests/topology/make_machines.py' % ', '.join(stale))
    sys.exit(1)
print('tests/topology/data/ matches make_machines.py')
