"""Chapter 7's grading: its checks, known bugs and oracles (``grader.chapters``)."""
