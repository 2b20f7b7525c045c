//! Two gateways on one PostgreSQL state serving one whatsapp account (being written).
