//! Two gateways on one PostgreSQL state serving one line account (being written).
