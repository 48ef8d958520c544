"""The seed's claims C1-C11: one table of claims and their rules, the judge, and claims.md."""
