"""Issue 35's context-back experiment (README.md here): a DFlash 1 drafter whose ``fc`` also reads the positions
before each context position. Answered research; no server runs such a drafter, so it left the trainer."""
