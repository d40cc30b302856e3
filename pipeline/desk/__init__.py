"""The QA desk: what a supervisor does with the stored calls: search across them first."""
