"""``python -m hypermedia.worker.unit ROLE``: a worker unit's control (:mod:`hypermedia.worker.unit.control`)."""

from hypermedia.worker.unit.control import main

main()
