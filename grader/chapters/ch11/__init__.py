"""Chapter 11's grading: its checks, known bugs and oracles (``grader.chapters``)."""
