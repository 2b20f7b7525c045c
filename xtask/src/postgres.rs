//! A throwaway PostgreSQL cluster for the PostgreSQL backend's tests (`CLAWGATE_TEST_PG_URL`):
//! Debian's `postgresql` installed when `initdb` is missing, a cluster in a temporary directory
//! on a free loopback port, trust authentication on 127.0.0.1 only, TLS on (a throwaway CA,
//! `CLAWGATE_TEST_PG_CA`, signs its certificate for `localhost` and 127.0.0.1) but not required,
//! stopped by its pid when dropped. `cargo xtask ci` starts one for the whole run (unless `CLAWGATE_TEST_PG=0`);
//! `cargo xtask pg start` starts one and leaves it running for a developer.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

use crate::cmd::{display, run as run_command, succeeds};

/// The variable the PostgreSQL tests read.
pub(crate) const URL_VAR: &str = "CLAWGATE_TEST_PG_URL";
/// The variable naming the PEM file of the CA that signed the cluster's certificate.
pub(crate) const CA_VAR: &str = "CLAWGATE_TEST_PG_CA";
/// `CLAWGATE_TEST_PG=0` leaves the PostgreSQL tests out.
pub(crate) const SWITCH_VAR: &str = "CLAWGATE_TEST_PG";
/// The test target that needs a server.
pub(crate) const PACKAGE: &str = "clawgate-store-postgres";
pub(crate) const TEST_TARGET: &str = "postgres";

/// Debian keeps each major version's server binaries here.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";
/// The system user Debian's package creates; `initdb` refuses to run as root.
const SYSTEM_USER: &str = "postgres";

/// Whether `CLAWGATE_TEST_PG=0` asks to leave the PostgreSQL tests out.
pub(crate) fn left_out() -> bool {
    std::env::var(SWITCH_VAR).is_ok_and(|value| value.trim() == "0")
}

/// The gateway's tests that run two binaries on one PostgreSQL state (a module of its
/// `gateway` test target).
pub(crate) const GATEWAY_MODULE: &str = "shared_postgres";

/// The nextest filter that leaves the PostgreSQL test target and the gateway's shared-state
/// tests out.
pub(crate) fn nextest_filter() -> String {
    format!("not binary_id({PACKAGE}::{TEST_TARGET}) and not test(/^{GATEWAY_MODULE}::/)")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// Whether a PostgreSQL server is installed (Debian's layout).
pub(crate) fn installed() -> bool {
    find_bin().is_some()
}

/// The newest installed server's `bin` directory.
fn find_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(DEBIAN_ROOT)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// `apt-get install postgresql`, as root or through sudo; the cluster the package starts as a
/// system service is stopped and kept off (the tests start their own).
fn install_postgresql() -> anyhow::Result<PathBuf> {
    println!("postgres: installing Debian's postgresql (once per machine)");
    let root = is_root();
    if !root && !succeeds(Command::new("sudo").arg("-n").arg("true")) {
        bail!(
            "initdb is missing and this user cannot install packages: install Debian's \
             postgresql (apt-get install postgresql) for the PostgreSQL backend's tests, or set \
             {SWITCH_VAR}=0 to leave them out"
        );
    }
    let as_root = |program: &str, args: &[&str]| {
        let mut command = if root {
            Command::new(program)
        } else {
            let mut sudo = Command::new("sudo");
            sudo.arg(program);
            sudo
        };
        command.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        command
    };
    if let Err(error) = run_command(&mut as_root("apt-get", &["update", "-qq"])) {
        println!("postgres: apt-get update failed ({error:#}); trying the install anyway");
    }
    run_command(&mut as_root(
        "apt-get",
        &["install", "-y", "-qq", "postgresql"],
    ))?;
    if Path::new("/run/systemd/system").exists() {
        let _ = succeeds(&mut as_root(
            "systemctl",
            &["disable", "--now", "postgresql"],
        ));
    } else if Path::new("/etc/init.d/postgresql").exists() {
        let _ = succeeds(&mut as_root("update-rc.d", &["postgresql", "disable"]));
        let _ = succeeds(&mut as_root("/etc/init.d/postgresql", &["stop"]));
    }
    find_bin().with_context(|| {
        format!("apt-get installed postgresql but no {DEBIAN_ROOT}/<version>/bin/initdb exists")
    })
}

/// Runs a server tool with its output kept, shown only when it fails (`pg start` prints
/// nothing but its two lines).
fn quiet(command: &mut Command) -> anyhow::Result<()> {
    let line = display(command);
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{line}`"))?;
    if !output.status.success() {
        bail!(
            "`{line}` failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// A free port on 127.0.0.1 (free when asked: the server binds it right after).
fn free_port() -> anyhow::Result<u16> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("cannot find a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// A running throwaway cluster; dropping it stops the server and deletes its directory.
#[derive(Debug)]
pub(crate) struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    /// Root runs the server as the `postgres` system user.
    as_system_user: bool,
    pid: Option<u32>,
    keep: bool,
    durable: bool,
}

impl Cluster {
    /// Installs the server if needed, then starts a cluster and waits until it accepts
    /// connections.
    pub(crate) fn start() -> anyhow::Result<Cluster> {
        Cluster::start_with(false)
    }

    /// A cluster with the server's durability defaults (fsync, full page writes): what the
    /// benchmarks measure, since their figures are durable sends.
    pub(crate) fn start_durable() -> anyhow::Result<Cluster> {
        Cluster::start_with(true)
    }

    fn start_with(durable: bool) -> anyhow::Result<Cluster> {
        let bin = match find_bin() {
            Some(bin) => bin,
            None => install_postgresql()?,
        };
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "clawgate-pg-{}-{}",
            std::process::id(),
            nanos % 1_000_000_000
        ));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let as_system_user = is_root();
        let mut cluster = Cluster {
            dir,
            bin,
            port: free_port()?,
            as_system_user,
            pid: None,
            keep: false,
            durable,
        };
        if as_system_user {
            run_command(
                Command::new("chown")
                    .arg(format!("{SYSTEM_USER}:"))
                    .arg(&cluster.dir),
            )?;
        }
        cluster.init()?;
        cluster.make_certificates()?;
        cluster.launch()?;
        Ok(cluster)
    }

    /// A superuser URL of the cluster's `postgres` database.
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The PEM file of the CA that signed the server's certificate.
    pub(crate) fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// What this run's children get: the URL and the CA file.
    pub(crate) fn exports(&self) -> Vec<(String, String)> {
        vec![
            (URL_VAR.to_owned(), self.url()),
            (CA_VAR.to_owned(), self.ca_file().display().to_string()),
        ]
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `program` of the server's bin directory, as the system user when we are root.
    fn tool(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut command = if self.as_system_user {
            let mut runuser = Command::new("runuser");
            runuser.args(["-u", SYSTEM_USER, "--"]).arg(path);
            runuser
        } else {
            Command::new(path)
        };
        // The system user may not enter the caller's working directory.
        command.current_dir(&self.dir);
        command
    }

    fn init(&self) -> anyhow::Result<()> {
        let mut initdb = self.tool("initdb");
        initdb.arg("-D").arg(self.data()).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        if !self.durable {
            initdb.arg("--no-sync");
        }
        quiet(&mut initdb)?;
        // Trust on 127.0.0.1 only: no socket logins, no other address.
        let hba = "# clawgate's throwaway test cluster\nhost all all 127.0.0.1/32 trust\n";
        std::fs::write(self.data().join("pg_hba.conf"), hba).context("cannot write pg_hba.conf")
    }

    /// A CA of its own (kept only as long as the cluster) and a server certificate it signs
    /// for `localhost` and 127.0.0.1, made with the `openssl` command (Debian's postgresql
    /// depends on it). The server's key is the server user's, mode 0600, as PostgreSQL demands.
    fn make_certificates(&self) -> anyhow::Result<()> {
        let dir = &self.dir;
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let openssl = |args: &[&str]| {
            let mut command = Command::new("openssl");
            command.args(args).current_dir(dir);
            quiet(&mut command).context("the test cluster's TLS certificates need `openssl`")
        };
        openssl(
            &[
                &[
                    "req",
                    "-x509",
                    "-days",
                    "7",
                    "-subj",
                    "/CN=clawgate test CA",
                ][..],
                &ec,
                &["-keyout", "ca.key", "-out", "ca.pem"],
                &["-addext", "basicConstraints=critical,CA:TRUE"],
                &["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            ]
            .concat(),
        )?;
        openssl(
            &[
                &[
                    "req",
                    "-subj",
                    "/CN=localhost",
                    "-keyout",
                    "server.key",
                    "-out",
                    "server.csr",
                ][..],
                &ec,
            ]
            .concat(),
        )?;
        let extensions = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
                          extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n";
        std::fs::write(dir.join("server.ext"), extensions).context("cannot write server.ext")?;
        let serial = format!(
            "{}",
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos())
        );
        openssl(&[
            "x509",
            "-req",
            "-days",
            "7",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            &serial,
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ])?;
        if self.as_system_user {
            run_command(
                Command::new("chown")
                    .arg(format!("{SYSTEM_USER}:"))
                    .arg(dir.join("server.key"))
                    .arg(dir.join("server.crt")),
            )?;
        }
        run_command(
            Command::new("chmod")
                .arg("0600")
                .arg(dir.join("server.key"))
                .arg(dir.join("ca.key")),
        )
    }

    fn launch(&mut self) -> anyhow::Result<()> {
        // Tests need no crash safety of the server itself; benchmarks keep its defaults. Room
        // for pgbench's clients and two gateways' pools.
        let durability = if self.durable {
            ""
        } else {
            "-c fsync=off -c full_page_writes=off"
        };
        let server_options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c max_connections=300 {durability} \
             -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
            self.port,
            self.dir.display(),
            self.dir.join("server.crt").display(),
            self.dir.join("server.key").display()
        );
        let mut pg_ctl = self.tool("pg_ctl");
        pg_ctl
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-o", &server_options, "-w", "-t", "60", "start"]);
        if let Err(error) = quiet(&mut pg_ctl) {
            let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
            bail!("the test cluster did not start: {error:#}\nserver log:\n{log}");
        }
        self.pid = std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()
            .and_then(|text| text.lines().next()?.trim().parse().ok());
        // `pg_ctl -w` waited for the server; the port answering is what the tests need.
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "the test cluster does not accept connections on port {}",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The command that stops the cluster and removes its directory, for a developer.
    fn stop_line(&self) -> String {
        let mut stop = self.tool("pg_ctl");
        stop.arg("-D").arg(self.data()).args(["stop", "-m", "fast"]);
        format!("{} && rm -rf {}", display(&stop), self.dir.display())
    }

    /// Leaves the cluster running after this process ends.
    fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let mut stop = self.tool("pg_ctl");
        stop.arg("-D")
            .arg(self.data())
            .args(["stop", "-m", "fast", "-w", "-t", "30"]);
        if !succeeds(&mut stop)
            && let Some(pid) = self.pid
        {
            // The postmaster by its pid, never by name: other clusters may run here.
            let _ = succeeds(Command::new("kill").args(["-KILL", &pid.to_string()]));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `cargo xtask pg start`: a cluster left running, with the lines to use and stop it.
pub(crate) fn start_for_developer() -> anyhow::Result<()> {
    let cluster = Cluster::start()?;
    for (name, value) in cluster.exports() {
        println!("export {name}={value}");
    }
    println!("# stop it with: {}", cluster.stop_line());
    cluster.keep();
    Ok(())
}
