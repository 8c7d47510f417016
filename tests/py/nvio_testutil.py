"""Small helpers shared by the nvio Python tests."""


def pattern(n, seed=0):
    """n bytes that differ at every offset (so misplaced bytes show up)."""
    import random
    return random.Random(seed * 1000003 + n).randbytes(n)


def write_file(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()
