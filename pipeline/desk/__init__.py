"""The QA desk: what a supervisor does with the stored calls (issue 38): search across them first."""
