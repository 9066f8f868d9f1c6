"""The inference data model every layer shares: datatypes, requests and responses, raw
tensor encoding, and a model's signature (what requests it accepts)."""
