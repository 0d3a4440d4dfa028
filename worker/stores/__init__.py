"""Transcript store backends (chosen by ``[transcripts] url``, see :mod:`worker.transcripts`)."""
