// dist tests (being written)
