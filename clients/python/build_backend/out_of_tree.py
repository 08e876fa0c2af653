"""setuptools' PEP 517 backend, run on a temporary copy of the sources.

setuptools writes build/ and weightd_client.egg-info next to the sources it builds, so
`pip install ./clients/python` left both in the checkout (and a stale build/ could put modules
that no longer exist into the next wheel). Building from a copy leaves the tree as it was.
Editable installs point at the sources themselves, so they are setuptools' own.
"""

import contextlib
import os
import shutil
import tempfile

from setuptools import build_meta as _setuptools


@contextlib.contextmanager
def _in_a_copy():
    sources = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="weightd-client-build-") as tmp:
        copy = os.path.join(tmp, "src")
        shutil.copytree(sources, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        os.chdir(copy)
        try:
            yield
        finally:
            os.chdir(sources)


def _from_a_copy(hook):
    def run(*args, **kwargs):
        with _in_a_copy():
            return hook(*args, **kwargs)

    run.__name__ = hook.__name__
    return run


get_requires_for_build_wheel = _from_a_copy(_setuptools.get_requires_for_build_wheel)
get_requires_for_build_sdist = _from_a_copy(_setuptools.get_requires_for_build_sdist)
prepare_metadata_for_build_wheel = _from_a_copy(_setuptools.prepare_metadata_for_build_wheel)
build_wheel = _from_a_copy(_setuptools.build_wheel)
build_sdist = _from_a_copy(_setuptools.build_sdist)
get_requires_for_build_editable = _setuptools.get_requires_for_build_editable
prepare_metadata_for_build_editable = _setuptools.prepare_metadata_for_build_editable
build_editable = _setuptools.build_editable
