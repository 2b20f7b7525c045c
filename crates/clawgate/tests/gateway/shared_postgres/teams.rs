//! Two gateways on one PostgreSQL state serving one teams account (being written).
