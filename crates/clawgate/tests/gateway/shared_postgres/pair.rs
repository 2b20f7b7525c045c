//! What every two-gateway test shares: one configuration naming a fresh schema of the
//! PostgreSQL test server, two state directories (`a` and `b`: each gateway's lock, log and
//! instance id), the gateways running on them, and reads of the shared state.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use crate::support::{BIN, GatewayProcess, Rng, lease_processes};

/// The longest random wait before a kill.
pub(super) const MAX_KILL_DELAY_MS: u64 = 700;

/// How the two gateways are configured besides the shared state.
pub(super) struct Setup {
    /// Names the fresh schema.
    pub(super) name: String,
    /// The `[[channels]]` table (with its `settings`), ending in a newline.
    pub(super) channel: String,
    /// The variables the channel's settings name, given to both gateways.
    pub(super) env: Vec<(&'static str, String)>,
    /// The bundled agent's reply length and the pause between its chunks.
    pub(super) words: usize,
    pub(super) chunk_ms: u64,
    /// How long an unknown send waits before it is reconciled.
    pub(super) reconcile_delay_ms: u64,
}

/// Two gateways on one PostgreSQL state, both configured for the same channel account; one
/// serves it at a time (account lease of 1 s, so a killed holder's account moves quickly).
pub(super) struct TwoGateways {
    pub(super) url: String,
    pub(super) schema: String,
    pub(super) dir: tempfile::TempDir,
    pub(super) config: PathBuf,
    env: Vec<(&'static str, String)>,
    seed: u64,
    running: [Option<GatewayProcess>; 2],
}

impl TwoGateways {
    /// Writes the shared configuration; starts no gateway yet.
    pub(super) fn new(setup: Setup, seed: u64) -> TwoGateways {
        let url = clawgate_store_postgres::testing::server_url();
        let schema = clawgate_store_postgres::testing::fresh_schema(&setup.name);
        let dir = tempfile::tempdir().expect("tempdir");
        let text = format!(
            "[state]\nbackend = \"postgres\"\npostgres_url_env = \"E2E_PG_URL\"\n\
             postgres_schema = \"{schema}\"\npostgres_pool_size = 4\naccount_lease_secs = 1\n\n\
             [gateway]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 3000\n\n\
             [retry]\nbase_delay_ms = 100\nmax_delay_ms = 2000\nreconcile_delay_ms = {}\n\n\
             [[agents]]\nid = \"main\"\ncommand = [{BIN:?}, \"demo-agent\", \"--chunk-ms\", \
             \"{}\", \"--words\", \"{}\"]\n\n{}",
            setup.reconcile_delay_ms, setup.chunk_ms, setup.words, setup.channel
        );
        let config = dir.path().join("clawgate.toml");
        std::fs::write(&config, text).expect("config written");
        TwoGateways {
            url,
            schema,
            dir,
            config,
            env: setup.env,
            seed,
            running: [None, None],
        }
    }

    /// The state directory of gateway `n`.
    pub(super) fn state(&self, n: usize) -> PathBuf {
        self.dir.path().join(["a", "b"][n])
    }

    /// Starts gateway `n` (again, after a kill: same state directory, same instance id).
    pub(super) fn start(&mut self, n: usize) {
        let mut env: Vec<(&str, &str)> = vec![("E2E_PG_URL", &self.url), ("CLAWGATE_LOG", "info")];
        env.extend(self.env.iter().map(|(name, value)| (*name, value.as_str())));
        let gateway = GatewayProcess::try_start(&self.state(n), &self.config, &env)
            .unwrap_or_else(|why| panic!("seed {}: {why}", self.seed));
        self.running[n] = Some(gateway);
    }

    /// SIGKILLs gateway `n`, if it runs.
    pub(super) fn kill(&mut self, n: usize) {
        if let Some(gateway) = self.running[n].take() {
            gateway.kill_hard();
        }
    }

    /// After a random while, SIGKILLs gateway `victim` with its work in flight.
    pub(super) async fn kill_after_a_while(&mut self, victim: usize, rng: &mut Rng) {
        tokio::time::sleep(Duration::from_millis(rng.below(MAX_KILL_DELAY_MS + 1))).await;
        self.kill(victim);
    }

    /// Restarts gateway `victim` once the other has had the time to take its account over:
    /// longer than the 1 s lease plus a renewal interval.
    pub(super) async fn restart_after_takeover(&mut self, victim: usize, rng: &mut Rng) {
        tokio::time::sleep(Duration::from_millis(
            1_500 + rng.below(MAX_KILL_DELAY_MS + 1),
        ))
        .await;
        self.start(victim);
    }

    /// Stops every running gateway with SIGINT; their exit statuses.
    pub(super) fn interrupt_all(&mut self) -> Vec<ExitStatus> {
        self.running
            .iter_mut()
            .filter_map(Option::take)
            .map(GatewayProcess::interrupt)
            .collect()
    }

    /// Whether gateway `n` ever served the account (its log says so).
    pub(super) fn served(&self, n: usize) -> bool {
        std::fs::read_to_string(self.state(n).with_extension("log"))
            .unwrap_or_default()
            .contains("serving this channel account")
    }

    /// Gateway `n`'s instance id: the holder it is named by in the account lease.
    pub(super) fn instance(&self, n: usize) -> String {
        std::fs::read_to_string(self.state(n).join("instance-id"))
            .map(|id| id.trim().to_owned())
            .unwrap_or_default()
    }

    /// Which gateway (0 or 1) holds the account lease now, if either does.
    pub(super) async fn holder(&self) -> Option<usize> {
        let leases = self
            .pairs("SELECT holder, epoch::text FROM {schema}.account_leases")
            .await;
        let holder = &leases.first()?.0;
        (0..2).find(|n| self.instance(*n) == *holder)
    }

    /// Rows of a two-column text query on the shared state (`{schema}` is replaced).
    pub(super) async fn pairs(&self, query: &str) -> Vec<(String, String)> {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .expect("a connection to the test server");
        tokio::spawn(connection);
        client
            .query(&query.replace("{schema}", &self.schema), &[])
            .await
            .expect("the query")
            .iter()
            .map(|row| (row.get::<_, String>(0), row.get::<_, String>(1)))
            .collect()
    }

    /// The shared reply intents: (idempotency key, status).
    pub(super) async fn intents(&self) -> Vec<(String, String)> {
        self.pairs("SELECT idempotency_key, status FROM {schema}.send_intents ORDER BY 1")
            .await
    }

    /// The shared inbound records: (event id, status).
    pub(super) async fn inbound(&self) -> Vec<(String, String)> {
        self.pairs("SELECT event_id, status FROM {schema}.inbound_records ORDER BY 1")
            .await
    }

    /// The keys of one of the channel's books in the shared state, sorted.
    pub(super) async fn book(&self, kind: &str, book: &str) -> Vec<String> {
        self.pairs(&format!(
            "SELECT key, book FROM {{schema}}.channel_records \
             WHERE kind = '{kind}' AND book = '{book}' ORDER BY key"
        ))
        .await
        .into_iter()
        .map(|(key, _)| key)
        .collect()
    }

    /// Every intent's and inbound record's status, sorted: it holds still once nothing is in
    /// progress.
    pub(super) async fn delivery_state(&self) -> Vec<(String, String)> {
        let mut rows = self.intents().await;
        rows.extend(self.inbound().await);
        rows.sort();
        rows
    }

    /// After both gateways stopped: every agent lease in the shared state is resolved and none
    /// of its processes runs. Returns what is wrong, if anything.
    pub(super) async fn leftovers(&self) -> Vec<String> {
        let mut wrong = Vec::new();
        for (lease, state) in self
            .pairs("SELECT lease_id, state FROM {schema}.acpx_leases")
            .await
        {
            if state == "open" || state == "closing" {
                wrong.push(format!("lease {lease} is still {state}"));
            }
            let pids = lease_processes(&lease);
            if !pids.is_empty() {
                wrong.push(format!(
                    "lease {lease} ({state}) still has processes {pids:?}"
                ));
            }
        }
        wrong
    }
}
