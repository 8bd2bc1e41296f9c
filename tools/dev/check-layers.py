#!/usr/bin/env python3
"""Checks strata's include rules from the sources (docs/architecture.md).

    tools/dev/check-layers.py [SOURCE_ROOT]     exit 1 and one line per violation, file:line
    tools/dev/check-layers.py --self-test       proves every rule fires on a scratch tree

The rules are a map of which unit may use which, not a line:
  * lib/<layer> includes its own headers and those of the layers MAY_USE lists for it, each by
    path from its root ("net/socket.hpp" is lib/net/include/net/socket.hpp);
  * a public header (<strata/...>) whose code lives in a layer (OWNER) counts as that layer's:
    lib/base may not include <strata/bootstrap.hpp>, whose Bootstrap has its destructor in
    lib/bootstrap. The SDK's interface headers (no code of their own) belong to no layer;
  * the public headers include only <strata/...> and system headers, by the same map;
  * each plug-in kind sees the public headers, the SDK and the layers PLUGIN_MAY_USE lists:
    bootstrap backends base, net, launch and mesh; transport backends and collectives base only;
    the built-in table base, launch and bootstrap; tools and bindings base, launch, watch,
    bootstrap and topology; tests anything but a private header;
  * a header in a layer's folder outside its include/ directory is private to that folder
    (lib/transport/internal.hpp: no file outside lib/transport includes it, tests included);
  * an exported internal header (lib/<layer>/include/<layer>/*.hpp) refuses to compile outside
    strata: it tests STRATA_INTERNAL_HEADERS and stops with #error;
  * across folders, a header is named by path from a root ("base/log.hpp"), never by a bare name
    or a relative path.
"""

import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]')
GUARD = re.compile(r'^\s*#\s*if(ndef\s+|\s+!\s*defined\s*\(?\s*)STRATA_INTERNAL_HEADERS\b')
SOURCE_EXT = ('.cpp', '.hpp', '.h', '.cu', '.cuh', '.c', '.cc')
TOP = ('lib', 'collectives', 'backends', 'tools', 'tests', 'bindings')
# Files meson generates into a target's build directory, by the folder that includes them.
GENERATED = {'lib/bootstrap': {'strata_build_paths.h'}, 'tools/strata-info': {'strata_info_features.h'}}

# Which layer of lib/ may use which (besides itself). Dependencies point down only.
MAY_USE = {
    'base': set(),
    'net': {'base'},
    'launch': {'base'},
    'mesh': {'base', 'net'},
    'watch': {'base', 'net'},
    'bootstrap': {'base', 'net', 'launch', 'mesh', 'watch'},
    'transport': {'base', 'bootstrap', 'topology'},
    'topology': {'base'},
    'core': {'base', 'bootstrap', 'transport'},
}
LIB_LAYERS = list(MAY_USE)
# Include roots (a quoted include "base/x.hpp" resolves under lib/base/include).
ROOTS = {layer: f'lib/{layer}/include' for layer in LIB_LAYERS}

# The plug-in kinds and what they may use of lib/ (they all see the public headers and SDK).
PLUGIN_MAY_USE = {
    'bootstrap backend': {'base', 'net', 'launch', 'mesh'},
    'transport backend': {'base'},
    'collectives': {'base'},
    'built-in table': {'base', 'launch', 'bootstrap'},
    'tool': {'base', 'launch', 'watch', 'bootstrap', 'topology'},
}

# The layer whose code a public header declares. Headers not listed are the SDK's interfaces
# (backend/*.hpp, device*.hpp: abstract classes and inline device structs), usable by anyone.
OWNER = {
    'strata/export.hpp': 'base',
    'strata/error.hpp': 'base',
    'strata/config.hpp': 'base',
    'strata/types.hpp': 'base',
    'strata/version.hpp': 'base',
    'strata/bootstrap.hpp': 'bootstrap',
    'strata/memory.hpp': 'transport',
    'strata/transport.hpp': 'transport',
    'strata/channel.hpp': 'transport',
    'strata/communicator.hpp': 'core',
    'strata/strata.hpp': 'core',
}


def unit_of(path):
    """The unit a source file belongs to: ('lib', layer), ('public', owner or None),
    ('plugin', kind, folder), ('test',)."""
    parts = path.split('/')
    if parts[0] == 'lib':
        if parts[1] == 'include':
            return ('public', OWNER.get('/'.join(parts[2:])))
        return ('lib', parts[1])
    if parts[0] == 'backends':
        if len(parts) == 2:
            return ('plugin', 'built-in table', 'backends')
        kind = 'bootstrap backend' if parts[1] == 'bootstrap' else 'transport backend'
        return ('plugin', kind, '/'.join(parts[:3]))
    if parts[0] == 'collectives':
        return ('plugin', 'collectives', '/'.join(parts[:2]))
    if parts[0] in ('tools', 'bindings'):
        return ('plugin', 'tool', '/'.join(parts[:2]))
    return ('test',)


def resolve(root, including, name):
    """The source-relative path a quoted include names, and how it was found, or (None, None)."""
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
    if parts[0] == 'lib' and parts[1] in MAY_USE and parts[2] != 'include':
        return '/'.join(parts[:2])
    return None


def layer_may_use(layer, other):
    return other == layer or other in MAY_USE.get(layer, set())


def check_public(unit, name):
    """An include of <strata/...> (or a system header) by `unit`; why it breaks a rule, or None."""
    owner = OWNER.get(name)
    if not name.startswith('strata/') or owner is None:
        return None  # a system header, or an SDK interface
    if unit[0] == 'lib' and not layer_may_use(unit[1], owner):
        return (f'lib/{unit[1]} may not include <{name}>, whose code is in lib/{owner} '
                f'(lib/{unit[1]} may use: {", ".join(sorted(MAY_USE[unit[1]])) or "nothing"})')
    if unit[0] == 'public' and unit[1] is not None and not layer_may_use(unit[1], owner):
        return f'a public header of lib/{unit[1]} may not include <{name}>, whose code is in lib/{owner}'
    return None


def check_include(root, path, unit, kind, name):
    """Why this include breaks a rule, or None."""
    folder = os.path.dirname(path)
    if kind == '<':
        return check_public(unit, name)
    if name in GENERATED.get(folder, ()):
        return None
    target, how = resolve(root, path, name)
    if target is None:
        return f'"{name}" is not a file of this tree (a bare name across folders, or a typo)'
    owner = private_owner(target)
    if owner and not path.startswith(owner + '/'):
        return f'"{name}" is private to {owner}'
    if how == 'relative':
        return f'"{name}" reaches another folder by a relative path; name it from its root'
    if unit[0] == 'public':
        return f'public headers include only <strata/...> and system headers, not "{name}"'
    if how == 'same folder':
        return None
    t = unit_of(target)
    if unit[0] == 'lib':
        if t[0] == 'lib' and how == 'root' and layer_may_use(unit[1], t[1]):
            return None
        if t[0] == 'lib':
            allowed = ', '.join(sorted(MAY_USE[unit[1]])) or 'nothing'
            return (f'lib/{unit[1]} may not include lib/{t[1]} ("{name}"): it may use {allowed}')
        return f'lib/{unit[1]} may not include {target}: the library never includes collectives/, a backend or a tool'
    if unit[0] == 'plugin':
        kind_name, own = unit[1], unit[2]
        if t[0] == 'lib' and how == 'root' and t[1] in PLUGIN_MAY_USE[kind_name]:
            return None
        allowed = ', '.join(f'"{x}/..."' for x in sorted(PLUGIN_MAY_USE[kind_name]))
        return (f'{own} ({kind_name}) may include only <strata/...>, {allowed} and its own folder, '
                f'not "{name}"')
    # tests: anything not private, by root or from the source root
    return None


def exported(path):
    """Whether path is an exported internal header: lib/<layer>/include/<layer>/...hpp."""
    parts = path.split('/')
    return (len(parts) >= 5 and parts[0] == 'lib' and parts[1] in MAY_USE and parts[2] == 'include'
            and parts[3] == parts[1] and path.endswith(('.hpp', '.h')))


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
        guarded = False
        with open(os.path.join(root, path), encoding='utf-8', errors='replace') as f:
            lines = f.readlines()
        for lineno, line in enumerate(lines, 1):
            guarded = guarded or bool(GUARD.match(line))
            m = INCLUDE.match(line)
            if not m:
                continue
            why = check_include(root, path, unit, m.group(1), m.group(2))
            if why:
                problems.append(f'{path}:{lineno}: {why}')
        if exported(path) and not guarded:
            problems.append(f'{path}:1: an exported internal header must refuse to compile '
                            f'outside strata (#ifndef STRATA_INTERNAL_HEADERS / #error)')
    return problems


GUARD_TEXT = '#ifndef STRATA_INTERNAL_HEADERS\n#error "internal to strata"\n#endif\n'


def self_test():
    """Every rule fires on a scratch tree, and a clean tree passes."""
    g = GUARD_TEXT
    files = {
        'lib/include/strata/bootstrap.hpp': '#include <strata/config.hpp>\n',
        'lib/include/strata/config.hpp': '',
        'lib/include/strata/communicator.hpp': '#include <strata/bootstrap.hpp>\n',
        'lib/include/strata/backend/module.hpp': '#include <strata/communicator.hpp>\n',
        'lib/base/include/base/log.hpp': g,
        'lib/base/log.cpp': '#include "base/log.hpp"\n#include <strata/config.hpp>\n',
        'lib/net/include/net/socket.hpp': g + '#include "base/log.hpp"\n',
        'lib/launch/include/launch/contract.hpp': g,
        'lib/mesh/include/mesh/peer_mesh.hpp': g + '#include "net/socket.hpp"\n',
        'lib/watch/include/watch/watch.hpp': g + '#include "net/socket.hpp"\n',
        'lib/watch/analysis.hpp': '',
        'lib/watch/analysis.cpp': '#include "analysis.hpp"\n#include "watch/watch.hpp"\n',
        'lib/bootstrap/include/bootstrap/registry.hpp': g + '#include "base/log.hpp"\n',
        'lib/bootstrap/registry.cpp': ('#include "bootstrap/registry.hpp"\n#include "strata_build_paths.h"\n'
                                       '#include "mesh/peer_mesh.hpp"\n#include "watch/watch.hpp"\n'
                                       '#include "launch/contract.hpp"\n#include <strata/backend/module.hpp>\n'),
        'lib/transport/internal.hpp': '',
        'lib/transport/context.cpp': '#include "internal.hpp"\n#include "bootstrap/registry.hpp"\n',
        'lib/core/communicator.cpp': '#include <strata/backend/collectives.hpp>\n#include <strata/communicator.hpp>\n',
        'collectives/host/engine.hpp': '',
        'collectives/host/engine.cpp': '#include "engine.hpp"\n#include "base/log.hpp"\n',
        'backends/transport/shm/shm.hpp': '',
        'backends/transport/shm/shm.cpp': '#include "shm.hpp"\n#include <strata/communicator.hpp>\n',
        'backends/bootstrap/tcp/tcp.cpp': '#include "mesh/peer_mesh.hpp"\n#include "launch/contract.hpp"\n',
        'backends/builtin.cpp': '#include "bootstrap/registry.hpp"\n#include "launch/contract.hpp"\n',
        'tests/unit/t.cpp': '#include "collectives/host/engine.hpp"\n#include "mesh/peer_mesh.hpp"\n',
        'tools/info/i.cpp': '#include "bootstrap/registry.hpp"\n#include "watch/watch.hpp"\n',
    }
    bad = {
        # the three rules broken before lib/base became a foundation again
        'lib/base/up.cpp': ('#include "launch/contract.hpp"\n', 'lib/base may not include lib/launch'),
        'lib/base/bs.hpp': ('#include <strata/bootstrap.hpp>\n', 'whose code is in lib/bootstrap'),
        'backends/transport/shm/s.cpp': ('#include "net/socket.hpp"\n', 'transport backend) may include only'),
        # the map, one arrow at a time
        'lib/net/up.cpp': ('#include "mesh/peer_mesh.hpp"\n', 'lib/net may not include lib/mesh'),
        'lib/launch/up.cpp': ('#include "net/socket.hpp"\n', 'lib/launch may not include lib/net'),
        'lib/mesh/side.cpp': ('#include "watch/watch.hpp"\n', 'lib/mesh may not include lib/watch'),
        'lib/watch/side.cpp': ('#include "mesh/peer_mesh.hpp"\n', 'lib/watch may not include lib/mesh'),
        'lib/transport/skip.cpp': ('#include "net/socket.hpp"\n', 'lib/transport may not include lib/net'),
        'lib/core/skip.cpp': ('#include "launch/contract.hpp"\n', 'lib/core may not include lib/launch'),
        'lib/bootstrap/up.cpp': ('#include <strata/transport.hpp>\n', 'whose code is in lib/transport'),
        'lib/include/strata/error.hpp': ('#include <strata/communicator.hpp>\n', 'a public header of lib/base may not include'),
        'lib/core/up.cpp': ('#include "collectives/host/engine.hpp"\n', 'never includes collectives'),
        'lib/core/private.cpp': ('#include "lib/transport/internal.hpp"\n', 'private to lib/transport'),
        'lib/bootstrap/private.cpp': ('#include "lib/watch/analysis.hpp"\n', 'private to lib/watch'),
        'tests/unit/private.cpp': ('#include "lib/transport/internal.hpp"\n', 'private to lib/transport'),
        # one rule per plug-in kind
        'collectives/host/core.cpp': ('#include "bootstrap/registry.hpp"\n', '(collectives) may include only'),
        'collectives/host/net.cpp': ('#include "launch/contract.hpp"\n', '(collectives) may include only'),
        'backends/bootstrap/tcp/w.cpp': ('#include "watch/watch.hpp"\n', '(bootstrap backend) may include only'),
        'backends/bootstrap/tcp/b.cpp': ('#include "bootstrap/registry.hpp"\n', '(bootstrap backend) may include only'),
        'backends/transport/fabric/f.cpp': ('#include "backends/transport/shm/shm.hpp"\n', 'may include only'),
        'backends/builtin2.cpp': ('#include "mesh/peer_mesh.hpp"\n', '(built-in table) may include only'),
        'tools/info/j.cpp': ('#include "mesh/peer_mesh.hpp"\n', '(tool) may include only'),
        'tools/info/k.cpp': ('#include "lib/transport/context.cpp"\n', 'private'),
        # spelling and guards
        'backends/transport/fabric/g.cpp': ('#include "log.hpp"\n', 'bare name across folders'),
        'backends/transport/fabric/h.cpp': ('#include "../shm/shm.hpp"\n', 'relative path'),
        'lib/include/strata/p.hpp': ('#include "base/log.hpp"\n', 'public headers include only'),
        'lib/net/include/net/unguarded.hpp': ('#include "base/log.hpp"\n', 'refuse to compile outside strata'),
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
