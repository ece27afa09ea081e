"""Chapter 10's grading: its checks, known bugs and oracles (``grader.chapters``)."""
