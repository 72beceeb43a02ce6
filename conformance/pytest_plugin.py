"""pytest plugin (registered through the pytest11 entry point)."""


def pytest_addoption(parser):
    group = parser.getgroup("dflash-conformance")
    group.addoption(
        "--dflash-impl",
        default=None,
        help="package.module:attribute of a DFlash implementation to run the conformance vectors against",
    )
