import serveproto


def test_package_imports():
    assert serveproto.__doc__.startswith("The serve protocol")
