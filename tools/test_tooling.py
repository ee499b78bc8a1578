"""Tests of the tree tooling: fetch, assemble and export.

They work on a throwaway tree (TREE=<tmp>) so the developer's build/cpython
is never touched, and never write to the repository: the throwaway tree is
assembled from the repository itself, so exporting it must change nothing.
"""

import os
import shutil
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")


def run(tool, *args, env=None):
    return subprocess.run([os.path.join(TOOLS, tool), *args],
                          capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def repo_state():
    """The repository's overlay and patches, as git sees the work tree."""
    return subprocess.run(["git", "-C", ROOT, "status", "--porcelain",
                           "--untracked-files=all"],
                          capture_output=True, text=True).stdout


class FetchTests(unittest.TestCase):

    def test_checksum_mismatch_is_refused(self):
        with tempfile.NamedTemporaryFile(suffix=".tgz") as bad:
            bad.write(b"not the CPython release")
            bad.flush()
            proc = run("fetch-source.sh", env={"CPYTHON_TARBALL": bad.name})
        self.assertEqual(proc.returncode, 1)
        self.assertIn("sha256", proc.stderr)
        self.assertEqual(proc.stdout, "")

    def test_verified_tarball_is_found(self):
        proc = run("fetch-source.sh")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(os.path.isfile(proc.stdout.strip()))


class TreeTests(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="perf-tree-test-")
        cls.env = {"TREE": os.path.join(cls.tmp, "cpython")}
        proc = run("assemble.sh", env=cls.env)
        if proc.returncode != 0:
            shutil.rmtree(cls.tmp)
            raise AssertionError("assemble failed: " + proc.stderr)
        cls.tree = cls.env["TREE"]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def git(self, *args):
        return subprocess.run(["git", "-C", self.tree, *args],
                              capture_output=True, text=True, check=True).stdout

    def test_tree_has_pristine_and_overlay_commits(self):
        log = self.git("log", "--format=%s").splitlines()
        self.assertEqual(log, ["Overlay and patches", "Pristine CPython 3.11.2"])
        self.assertEqual(self.git("status", "--porcelain"), "")

    def test_export_of_unchanged_tree_is_a_no_op(self):
        before = repo_state()
        proc = run("export.sh", env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("nothing to export", proc.stderr)
        self.assertEqual(repo_state(), before)
        self.assertEqual(run("export.sh", "--check", env=self.env).returncode, 0)

    def test_export_is_deterministic(self):
        first = run("export.sh", "--hash", env=self.env).stdout
        second = run("export.sh", "--hash", env=self.env).stdout
        self.assertEqual(first, second)
        self.assertRegex(first, r"^[0-9a-f]{64}\n$")

    def test_assemble_refuses_to_clobber_edits(self):
        path = os.path.join(self.tree, "Python", "ceval.c")
        with open(path, "a") as f:
            f.write("/* an edit that was never exported */\n")
        try:
            self.assertEqual(run("export.sh", "--check", env=self.env).returncode, 1)
            proc = run("assemble.sh", "--force", env=self.env)
            self.assertEqual(proc.returncode, 1)
            self.assertIn("not exported", proc.stderr)
            with open(path) as f:
                self.assertIn("never exported", f.read())
        finally:
            self.git("checkout", "--", "Python/ceval.c")

    def test_reassemble_keeps_unchanged_files(self):
        path = os.path.join(self.tree, "Objects", "listobject.c")
        mtime = os.stat(path).st_mtime_ns
        proc = run("assemble.sh", "--force", env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(os.stat(path).st_mtime_ns, mtime)


if __name__ == "__main__":
    unittest.main()
