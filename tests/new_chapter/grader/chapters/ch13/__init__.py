"""Chapter 13's grading: its checks, known bugs and oracles (``grader.chapters``)."""
