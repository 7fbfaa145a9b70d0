"""``python -m ckptlab``."""

# Before anything of the lab is imported: no collection while torch and transformers load (ckptlab.torchstate).
from .torchstate import pause_collection

pause_collection()

from .cli import end_process, main  # noqa: E402 - after the pause, which must come first

end_process(main(own_process=True))
