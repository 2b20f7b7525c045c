//! The channel contract suite, polling and webhook.

clawgate_conformance::conformance_tests!(telegram_polling, crate::peer::Peer::polling().await);
clawgate_conformance::conformance_tests!(telegram_webhook, crate::peer::Peer::webhook().await);
