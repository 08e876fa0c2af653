"""The tests exercise the package as installed in the venv, as an engine imports it, not the source tree."""

import os
import sysconfig

import weightd_client


def test_imported_from_site_packages():
    here = os.path.realpath(weightd_client.__file__)
    assert here.startswith(os.path.realpath(sysconfig.get_paths()["purelib"])), here
