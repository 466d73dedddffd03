"""Issue 20, the gateway's side: what the client imports is what the service checked (rows 4,
5, 6 of the issue's table) and a sync handler's thread gets its own copy of the context. Through
the real service, with this process as the gateway (helpers from ``test_in_gateway``)."""

import asyncio
import hashlib
import os
import sys
import tempfile

from test_in_gateway import GatewayCase, _write_hook  # noqa: E402  (discover puts HERE on sys.path)

from hermes_hooks import _trusted  # noqa: E402
from hermes_hooks._ingateway import InGatewayHooks  # noqa: E402

GATEWAY = "events: ['agent:*']\nruns: gateway\n"


class ClientVerifiesWhatItImports(GatewayCase):
    async def test_row_4_edited_helper_module_is_not_imported(self):
        d = _write_hook(self.hooks(), "with-helper", GATEWAY,
                        "import gateway.run\nimport hh_row4_helper\n\n"
                        "def handle(event, context):\n    return hh_row4_helper.VALUE\n")
        with open(os.path.join(d, "hh_row4_helper.py"), "w") as f:
            f.write("VALUE = 'approved'\n")
        os.chmod(os.path.join(d, "hh_row4_helper.py"), 0o644)
        self.serve(extra=["--no-watch"])
        # Edited after the service checked (and maybe approved) the hook.
        with open(os.path.join(d, "hh_row4_helper.py"), "w") as f:
            f.write("import os\nos.environ['HH_ROW4_INJECTED'] = '1'\nVALUE = 'injected'\n")
        registry = self.registry()
        registry.discover_and_load()
        self.addCleanup(sys.modules.pop, "hh_row4_helper", None)
        (entry,) = registry.loaded_hooks
        self.assertIsNone(os.environ.pop("HH_ROW4_INJECTED", None), "the edited helper ran")
        self.assertNotEqual(entry["status"], "imported", entry)
        self.assertIn("hh_row4_helper.py", entry.get("error", ""), entry)
        self.assertNotIn("hh_row4_helper", sys.modules)

    async def test_row_6_a_hook_never_shadows_the_gateways_imports(self):
        for name in ("smtplib", "hh_row6_probe"):
            saved = sys.modules.pop(name, None)
            if saved is not None:
                self.addCleanup(sys.modules.__setitem__, name, saved)
            else:
                self.addCleanup(sys.modules.pop, name, None)
        d = _write_hook(self.hooks(), "shadow", GATEWAY,
                        "import gateway.run\n\ndef handle(event, context):\n    return None\n")
        with open(os.path.join(d, "smtplib.py"), "w") as f:
            f.write("SHADOW = True\n")
        os.chmod(os.path.join(d, "smtplib.py"), 0o644)
        self.serve()
        registry = self.registry()
        registry.discover_and_load()
        (entry,) = registry.loaded_hooks
        self.assertEqual(entry["status"], "imported", entry)
        import smtplib
        self.assertFalse(getattr(smtplib, "SHADOW", False), smtplib.__file__)
        # A hook the client refuses leaves nothing behind on the import path either.
        self.assertFalse(any(d in p for p in sys.path), sys.path)


class ClientChecksWhereItImportsFrom(GatewayCase):
    def _entry(self, hook_dir):
        handler = os.path.join(hook_dir, "handler.py")
        with open(handler, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        return {"name": "squat", "runs": "gateway", "events": ["agent:start"], "path": hook_dir,
                "handler": handler, "sha256": sha, "files": {"handler.py": sha}}

    def test_row_5_a_listing_pointing_outside_the_hooks_root_is_refused(self):
        outside = tempfile.mkdtemp(prefix="hh-squat-")
        self.addCleanup(__import__("shutil").rmtree, outside, True)
        d = _write_hook(outside, "squat", GATEWAY,
                        "import os\nos.environ['HH_ROW5_RAN'] = '1'\n\n"
                        "def handle(event, context):\n    return None\n")
        os.chmod(os.path.join(d, "handler.py"), 0o666)
        self.addCleanup(sys.modules.pop, "hermes_hook_squat", None)
        entry = self._entry(d)
        InGatewayHooks().load([entry], self.home)
        self.assertIsNone(os.environ.pop("HH_ROW5_RAN", None), "a handler outside the root ran")
        self.assertEqual(entry["status"], "refused", entry)
        self.assertIn("not inside the hook roots", entry["error"])

    def test_row_5_an_unsafe_file_inside_the_root_is_refused(self):
        d = _write_hook(self.hooks(), "squat", GATEWAY,
                        "import os\nos.environ['HH_ROW5B_RAN'] = '1'\n\n"
                        "def handle(event, context):\n    return None\n")
        os.chmod(os.path.join(d, "handler.py"), 0o666)
        self.addCleanup(sys.modules.pop, "hermes_hook_squat", None)
        entry = self._entry(d)
        InGatewayHooks().load([entry], self.home)
        self.assertIsNone(os.environ.pop("HH_ROW5B_RAN", None))
        self.assertIn("writable by group or others", entry["error"])

    def test_row_5_the_service_must_be_who_it_says(self):
        self.assertIsNone(_trusted.service_problem("unix", os.geteuid(), False))
        self.assertIn("served by uid", _trusted.service_problem("unix", os.geteuid() + 1, False))
        self.assertIn("token", _trusted.service_problem("tcp", None, False))
        self.assertIsNone(_trusted.service_problem("tcp", None, True))


class SyncHandlersGetACopy(GatewayCase):
    async def test_a_sync_handler_on_its_thread_never_mutates_the_callers_dict(self):
        _write_hook(self.hooks(), "mutator", "events: ['agent:step']\nruns: gateway\n",
                    "import gateway.run\n\ndef handle(event, context):\n"
                    "    for i in range(200):\n        context['k%d' % i] = i\n"
                    "    context.clear()\n    return None\n")
        self.serve()
        registry = self.registry()
        registry.discover_and_load()
        self.addCleanup(sys.modules.pop, "hermes_hook_mutator", None)
        ctx = {"platform": "fakechat", "message": "hi"}
        for _ in range(50):
            await registry.emit("agent:step", ctx)
            for _k in list(ctx):
                pass
            await asyncio.sleep(0)
        await registry.emit_collect("agent:step", ctx)
        self.assertEqual(ctx, {"platform": "fakechat", "message": "hi"})


def _build_extension(directory, name):
    """Compiles extension module ``name`` (``word()`` returns its name) into ``directory``."""
    import subprocess
    import sysconfig
    include = sysconfig.get_paths()["include"]
    source = os.path.join(directory, name + ".c")
    with open(source, "w") as f:
        f.write('#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n'
                'static PyObject *word(PyObject *s, PyObject *a) '
                '{ return PyUnicode_FromString("%s"); }\n'
                'static PyMethodDef m[] = {{"word", word, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};\n'
                'static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, "%s", NULL, -1, m};\n'
                'PyMODINIT_FUNC PyInit_%s(void) { return PyModule_Create(&d); }\n'
                % (name, name, name))
    target = os.path.join(directory, name + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["cc", "-shared", "-fPIC", "-I", include, "-o", target, source], check=True)
    os.remove(source)
    return target


class EachExtensionModuleLoadsItsOwnLibrary(GatewayCase):
    def test_issue_46_row_9_two_extension_modules(self):
        """Issue 46 row 9: the second extension module of a hook failed ("does not define module
        export function (PyInit_hh_ext_b)"): both came from the same ``/proc/self/fd/N`` name."""
        with tempfile.TemporaryDirectory() as d:
            files = {}
            for name in ("hh_ext_a", "hh_ext_b"):
                path = _build_extension(d, name)
                with open(path, "rb") as f:
                    files[os.path.basename(path)] = hashlib.sha256(f.read()).hexdigest()
            finder = _trusted.HookFinder("two-ext", d, files)
            finder.install()
            sys.path.insert(0, d)
            self.addCleanup(finder.uninstall)
            self.addCleanup(sys.path.remove, d)
            for name in ("hh_ext_a", "hh_ext_b"):
                self.addCleanup(sys.modules.pop, name, None)
            import hh_ext_a
            import hh_ext_b
            self.assertEqual((hh_ext_a.word(), hh_ext_b.word()), ("hh_ext_a", "hh_ext_b"))
            self.assertTrue(hh_ext_b.__file__.startswith("/proc/self/fd/"), hh_ext_b.__file__)
