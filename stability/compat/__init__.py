"""Other libraries' private behaviour, one module per library feature, each contract
exercised by tests/test_private_apis.py."""
