#!/usr/bin/env python3
"""Checks strata's include rules from the sources (docs/architecture.md).

    tools/dev/check-layers.py [SOURCE_ROOT]     exit 1 and one line per violation, file:line
    tools/dev/check-layers.py --self-test       proves every rule fires on a scratch tree

The rules:
  * a layer includes only its own and lower layers: base < bootstrap < transport < core;
  * lib/core never includes collectives/ or a backend;
  * backends (backends/<kind>/<name>/) and collectives backends (collectives/<name>/) see the
    public headers and SDK (<strata/...>), lib/base ("base/...") and their own folder only: never
    another backend, lib/core, or any other layer;
  * a header in a layer's folder outside its include/ directory is private to that folder
    (lib/transport/internal.hpp: no file outside lib/transport includes it, tests included);
  * the public headers (lib/include/strata) include only <strata/...> and system headers;
  * across folders, a header is named by path from a root ("base/log.hpp"), never by a bare name.
Tools may also use the registry ("bootstrap/registry.hpp"); tests may also include a backend's
or the host collectives' own headers by path from the source root, to test them.
"""

import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]')
SOURCE_EXT = ('.cpp', '.hpp', '.h', '.cu', '.cuh', '.c', '.cc')
TOP = ('lib', 'collectives', 'backends', 'tools', 'tests', 'bindings')
# Files meson generates into a target's build directory, by the folder that includes them.
GENERATED = {'lib/bootstrap': {'strata_build_paths.h'}, 'tools/strata-info': {'strata_info_features.h'}}
LIB_LAYERS = ['base', 'bootstrap', 'transport', 'core']
# Include roots (a quoted include "base/x.hpp" resolves under lib/base/include).
ROOTS = {layer: f'lib/{layer}/include' for layer in LIB_LAYERS}


def unit_of(path):
    """The unit a source file belongs to: ('lib', layer), ('backend', folder),
    ('collectives', folder), ('builtin',), ('public',), ('tool', folder), ('test',)."""
    parts = path.split('/')
    if parts[0] == 'lib':
        if parts[1] == 'include':
            return ('public',)
        return ('lib', parts[1])
    if parts[0] == 'backends':
        if len(parts) == 2:
            return ('builtin',)
        return ('backend', '/'.join(parts[:3]))
    if parts[0] == 'collectives':
        return ('collectives', '/'.join(parts[:2]))
    if parts[0] in ('tools', 'bindings'):
        return ('tool', '/'.join(parts[:2]))
    return ('test',)


def resolve(root, including, name):
    """The source-relative path a quoted include names, or None when not found."""
    here = os.path.dirname(including)
    cand = os.path.normpath(os.path.join(here, name))
    if os.path.isfile(os.path.join(root, cand)):
        return cand, 'same folder' if '/' not in name else 'relative'
    first = name.split('/')[0]
    if first in ROOTS:
        cand = os.path.join(ROOTS[first], name)
        if os.path.isfile(os.path.join(root, cand)):
            return cand, 'root'
    if os.path.isfile(os.path.join(root, name)):
        return name, 'source root'
    return None, None


def private_owner(target):
    """For a private header of a lib layer (in lib/<layer>/ but not under its include/), that
    folder; else None."""
    parts = target.split('/')
    if parts[0] == 'lib' and parts[1] in LIB_LAYERS and parts[2] != 'include':
        return '/'.join(parts[:2])
    return None


def check_include(root, path, unit, kind, name):
    """Why this include breaks a rule, or None."""
    folder = os.path.dirname(path)
    if kind == '<':
        return None  # public headers, the SDK, system and third-party headers
    if name in GENERATED.get(folder, ()):
        return None
    target, how = resolve(root, path, name)
    if target is None:
        return f'"{name}" is not a file of this tree (a bare name across folders, or a typo)'
    tunit = unit_of(target)
    owner = private_owner(target)
    if owner and not path.startswith(owner + '/'):
        return f'"{name}" is private to {owner}'
    if how == 'relative':
        return f'"{name}" reaches another folder by a relative path; name it from its root'
    if unit[0] == 'public':
        return f'public headers include only <strata/...> and system headers, not "{name}"'
    if how == 'same folder':
        return None
    t = tunit
    if unit[0] == 'lib':
        me = LIB_LAYERS.index(unit[1])
        if t[0] == 'lib' and LIB_LAYERS.index(t[1]) <= me and how == 'root':
            return None
        if t[0] == 'lib':
            return f'lib/{unit[1]} may not include lib/{t[1]} ("{name}"): layers include downward only, by root'
        return f'lib/{unit[1]} may not include {target}: the library never includes collectives/ or a backend'
    if unit[0] in ('backend', 'collectives'):
        if t == ('lib', 'base') and how == 'root':
            return None
        return f'{unit[1]} may include only <strata/...>, "base/..." and its own folder, not "{name}"'
    if unit[0] == 'builtin':
        if t[0] == 'lib' and t[1] in ('base', 'bootstrap') and how == 'root':
            return None
        return f'the built-in table may include only <strata/...>, "base/..." and "bootstrap/...", not "{name}"'
    if unit[0] == 'tool':
        if t[0] == 'lib' and t[1] in ('base', 'bootstrap') and how == 'root':
            return None
        return f'tools may include only <strata/...>, "base/...", "bootstrap/..." and their own folder, not "{name}"'
    # tests: anything not private, by root or from the source root
    return None


def sources(root):
    for top in TOP:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith('.')]
            for f in sorted(filenames):
                if f.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def check(root):
    problems = []
    for path in sources(root):
        unit = unit_of(path)
        with open(os.path.join(root, path), encoding='utf-8', errors='replace') as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                why = check_include(root, path, unit, m.group(1), m.group(2))
                if why:
                    problems.append(f'{path}:{lineno}: {why}')
    return problems


def self_test():
    """Every rule fires on a scratch tree, and a clean tree passes."""
    files = {
        'lib/base/include/base/log.hpp': '',
        'lib/base/log.cpp': '#include "base/log.hpp"\n',
        'lib/bootstrap/include/bootstrap/registry.hpp': '#include "base/log.hpp"\n',
        'lib/bootstrap/registry.cpp': '#include "bootstrap/registry.hpp"\n#include "strata_build_paths.h"\n',
        'lib/transport/internal.hpp': '',
        'lib/transport/context.cpp': '#include "internal.hpp"\n#include "bootstrap/registry.hpp"\n',
        'lib/core/communicator.cpp': '#include <strata/backend/collectives.hpp>\n',
        'collectives/host/engine.hpp': '',
        'collectives/host/engine.cpp': '#include "engine.hpp"\n#include "base/log.hpp"\n',
        'backends/transport/shm/shm.hpp': '',
        'backends/transport/shm/shm.cpp': '#include "shm.hpp"\n',
        'backends/builtin.cpp': '#include "bootstrap/registry.hpp"\n',
        'lib/include/strata/x.hpp': '#include <strata/y.hpp>\n',
        'tests/unit/t.cpp': '#include "collectives/host/engine.hpp"\n#include "base/log.hpp"\n',
        'tools/info/i.cpp': '#include "bootstrap/registry.hpp"\n',
    }
    bad = {
        'lib/base/up.cpp': ('#include "bootstrap/registry.hpp"\n', 'may not include lib/bootstrap'),
        'lib/core/up.cpp': ('#include "collectives/host/engine.hpp"\n', 'never includes collectives'),
        'lib/core/private.cpp': ('#include "lib/transport/internal.hpp"\n', 'private to lib/transport'),
        'tests/unit/private.cpp': ('#include "lib/transport/internal.hpp"\n', 'private to lib/transport'),
        'collectives/host/core.cpp': ('#include "bootstrap/registry.hpp"\n', 'may include only'),
        'backends/transport/fabric/f.cpp': ('#include "backends/transport/shm/shm.hpp"\n', 'may include only'),
        'backends/transport/fabric/g.cpp': ('#include "log.hpp"\n', 'bare name across folders'),
        'backends/transport/fabric/h.cpp': ('#include "../shm/shm.hpp"\n', 'relative path'),
        'lib/include/strata/p.hpp': ('#include "base/log.hpp"\n', 'public headers include only'),
        'tools/info/j.cpp': ('#include "lib/transport/context.cpp"\n', 'private'),
    }
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), 'w') as f:
                f.write(text)
        for rel, text in files.items():
            write(rel, text)
        clean = check(root)
        if clean:
            print('self-test: a clean tree was reported:\n  ' + '\n  '.join(clean))
            return 1
        failed = 0
        for rel, (text, expect) in bad.items():
            write(rel, text)
            got = [p for p in check(root) if p.startswith(rel + ':1:')]
            os.remove(os.path.join(root, rel))
            if not got or expect not in got[0]:
                print(f'self-test: {rel} ({text.strip()}) should be reported with "{expect}"; got {got}')
                failed += 1
            else:
                print(f'ok: {got[0]}')
        return 1 if failed else 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == '--self-test':
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', '..')
    problems = check(os.path.abspath(root))
    for p in problems:
        print(p)
    if problems:
        print(f'{len(problems)} include(s) break the layering rules (docs/architecture.md)')
        return 1
    print('layering: every include follows the rules')
    return 0


if __name__ == '__main__':
    sys.exit(main())
