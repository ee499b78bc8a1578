"""The layers of Lib/perf_trampoline/: each module imports only those
below it, none imports the package back, and __init__ is the public API
only.
"""

import ast
import os
import unittest

import perf_trampoline

PACKAGE = "perf_trampoline"
# Lowest first: readers of ELF images and /proc, the attach protocol,
# the container maps, the reports and what writes them, recording, and
# the command line.
LAYERS = ["_elf", "_procfs", "_attach", "_namespaces", "_output",
          "_reports", "_record", "__main__"]
PUBLIC = ["attach", "detach", "status", "RemoteError"]
DIRECTORY = os.path.dirname(perf_trampoline.__file__)


def imported(module):
    """[(line, what)] of every import in `module` (a file of the package)
    of the package or one of its modules, at any depth: `what` is the
    module's name, or PACKAGE for the package itself."""
    with open(os.path.join(DIRECTORY, module + ".py")) as f:
        tree = ast.parse(f.read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                head, _, rest = alias.name.partition(".")
                if head == PACKAGE:
                    found.append((node.lineno,
                                  rest.partition(".")[0] or PACKAGE))
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:
                name = f"{PACKAGE}.{name}".rstrip(".")
            head, _, rest = name.partition(".")
            if head != PACKAGE:
                continue
            if rest:
                found.append((node.lineno, rest.partition(".")[0]))
                continue
            # from perf_trampoline import X: a module, or a name of the
            # package itself.
            for alias in node.names:
                found.append((node.lineno, alias.name
                              if alias.name in LAYERS else PACKAGE))
    return found


class LayerTests(unittest.TestCase):

    def test_every_module_has_its_layer(self):
        modules = sorted(name[:-3] for name in os.listdir(DIRECTORY)
                         if name.endswith(".py") and name != "__init__.py")
        self.assertEqual(modules, sorted(LAYERS))

    def test_no_module_imports_one_above_it(self):
        for level, module in enumerate(LAYERS):
            for line, name in imported(module):
                with self.subTest(module=module, line=line, imports=name):
                    self.assertNotEqual(name, PACKAGE,
                                        "imports the package back")
                    self.assertIn(name, LAYERS)
                    self.assertLess(LAYERS.index(name), level,
                                    f"{name} is not below {module}")

    def test_the_check_sees_imports(self):
        # The test above would pass on a module it could not read.
        self.assertIn("_elf", [name for _, name in imported("_procfs")])
        self.assertIn("_record", [name for _, name in imported("__main__")])

    def test_init_is_the_public_api(self):
        self.assertEqual(sorted(perf_trampoline.__all__), sorted(PUBLIC))
        public = [name for name in vars(perf_trampoline)
                  if not name.startswith("_")]
        self.assertEqual(sorted(public), sorted(PUBLIC))
        for line, name in imported("__init__"):
            with self.subTest(line=line, imports=name):
                self.assertIn(name, LAYERS)
        self.assertTrue(callable(perf_trampoline.attach))
        self.assertTrue(issubclass(perf_trampoline.RemoteError, Exception))


if __name__ == "__main__":
    unittest.main()
