"""Writing a file so that readers see the old file or the whole new one, never a part."""

import contextlib
import os
import tempfile

__all__ = ["replacing"]


@contextlib.contextmanager
def replacing(path):
    """Yields a temporary path beside `path`; on success it replaces `path`.

    The temporary file is in the same folder (os.replace is atomic only
    within one file system) and is removed if the block raises.

        with replacing("trace.json") as temporary:
            write(temporary)
    """
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(
        dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    os.close(handle)
    os.chmod(temporary, 0o644)  # mkstemp's 0600 would make the result private
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
