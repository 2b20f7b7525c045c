//! The test tools `cargo xtask ci` needs beyond cargo, installed once per machine so the README's
//! test command works on a fresh one: cargo-deny (licenses, bans, sources); Debian packages
//! (Chromium + chromedriver for the chat page's browser test, the IRC servers ngircd and
//! InspIRCd); pinned Python venvs under `<target>/python` (the simulators' cross-check clients
//! written against the real APIs, and Synapse, the Matrix channel's real homeserver); pinned npm
//! packages under `<target>/node` (more cross-check clients, and real ACP agents). The lists are [`PYTHON_TOOLS`] and
//! [`NPM_TOOLS`]; [`ensure_test_tools`] installs them. `cargo xtask setup` runs this alone;
//! `cargo xtask ci` runs it beside its first steps.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::bail;

use crate::cmd::{cargo, project_root, run as run_command, succeeds};

const CARGO_DENY: &str = "cargo-deny@0.20.2";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The IRC server the IRC channel's tests run against.
const NGIRCD: &str = "/usr/sbin/ngircd";
/// The IRCv3 server the IRC channel's `echo-message`/`labeled-response` tests run against.
const INSPIRCD: &str = "/usr/sbin/inspircd";

/// A Python package the tests run, pinned, in its own venv at `<target>/python/<venv>` (the
/// tests find it from their own binary's target directory).
struct PythonTool {
    venv: &'static str,
    package: &'static str,
    version: &'static str,
    /// What needs it, for the error when Python cannot make a venv.
    for_what: &'static str,
}

/// The aiogram the Telegram simulator's cross-check is written against.
const AIOGRAM: PythonTool = PythonTool {
    venv: "aiogram",
    package: "aiogram",
    version: "3.31.0",
    for_what: "the Telegram simulator's aiogram test (or point CLAWGATE_AIOGRAM_PYTHON at a \
               python that has aiogram)",
};

/// The official Slack SDK the Slack simulator's cross-check is written against.
const SLACK_SDK: PythonTool = PythonTool {
    venv: "slack-sdk",
    package: "slack-sdk",
    version: "3.48.0",
    for_what: "the Slack simulator's slack_sdk test (or point CLAWGATE_SLACK_SDK_PYTHON at a \
               python that has slack_sdk)",
};

/// The mattermostdriver the Mattermost simulator's cross-check is written against.
const MATTERMOSTDRIVER: PythonTool = PythonTool {
    venv: "mattermostdriver",
    package: "mattermostdriver",
    version: "7.3.2",
    for_what: "the Mattermost simulator's mattermostdriver test (or point \
               CLAWGATE_MATTERMOSTDRIVER_PYTHON at a python that has mattermostdriver)",
};

/// Google's generated Chat client (with google-auth) the Google Chat simulator's cross-check uses.
const GOOGLE_APPS_CHAT: PythonTool = PythonTool {
    venv: "google-apps-chat",
    package: "google-apps-chat",
    version: "0.10.7",
    for_what: "the Google Chat simulator's google-apps-chat test (or point \
               CLAWGATE_GOOGLE_CHAT_PYTHON at a python that has google-apps-chat)",
};

/// LINE's official SDK the LINE simulator's cross-check is written against.
const LINE_BOT_SDK: PythonTool = PythonTool {
    venv: "line-bot-sdk",
    package: "line-bot-sdk",
    version: "3.27.0",
    for_what: "the LINE simulator's line-bot-sdk test (or point CLAWGATE_LINE_BOT_SDK_PYTHON at \
               a python that has line-bot-sdk)",
};

/// The pywa the WhatsApp simulator's cross-check is written against.
const PYWA: PythonTool = PythonTool {
    venv: "pywa",
    package: "pywa",
    version: "4.5.0",
    for_what: "the WhatsApp simulator's pywa test (or point CLAWGATE_PYWA_PYTHON at a python \
               that has pywa)",
};

/// The Synapse release the Matrix channel's tests run against (its fixture names the same).
const SYNAPSE: PythonTool = PythonTool {
    venv: "synapse",
    package: "matrix-synapse",
    version: "1.163.2",
    for_what: "the Matrix channel's tests (Synapse runs in it)",
};

/// npm packages the tests run, pinned (`name@version`), installed together at
/// `<target>/node/<dir>` (the tests find them from their own binary's target directory).
struct NpmTool {
    dir: &'static str,
    packages: &'static [&'static str],
    /// What needs it, for the error when npm is missing.
    for_what: &'static str,
}

/// The tmi.js the Twitch simulator's TMI cross-check is written against.
const TMIJS: NpmTool = NpmTool {
    dir: "tmijs",
    packages: &["tmi.js@1.8.5"],
    for_what: "the Twitch simulator's tmi.js cross-check",
};

/// The twurple the Twitch simulator's Helix cross-check is written against.
const TWURPLE: NpmTool = NpmTool {
    dir: "twurple",
    packages: &["@twurple/api@8.2.0", "@twurple/auth@8.2.0"],
    for_what: "the Twitch simulator's twurple cross-check",
};

/// The nostr-tools the Nostr channel's cross-check is written against.
const NOSTR_TOOLS: NpmTool = NpmTool {
    dir: "nostr-tools",
    packages: &["nostr-tools@2.25.2"],
    for_what: "the Nostr channel's nostr-tools cross-check",
};

/// discord.js's REST client and Gateway client the Discord simulator's cross-check uses.
const DISCORDJS: NpmTool = NpmTool {
    dir: "discordjs",
    packages: &["@discordjs/rest@2.6.3", "@discordjs/ws@2.0.4"],
    for_what: "the Discord simulator's discord.js test (or point CLAWGATE_DISCORDJS_MODULES at a \
               node_modules with @discordjs/rest and @discordjs/ws)",
};

/// A third-party Zalo OA client (elizaOS's Zalo plugin) the Zalo simulator's cross-check
/// drives; no official Zalo SDK for Python is published.
const ELIZAOS_ZALO: PythonTool = PythonTool {
    venv: "elizaos-plugin-zalo",
    package: "elizaos-plugin-zalo",
    version: "2.0.0a5",
    for_what: "the Zalo simulator's elizaos-plugin-zalo test (or point CLAWGATE_ZALO_PYTHON at \
               a python that has elizaos-plugin-zalo)",
};

/// A third-party BlueBubbles client (elizaOS's BlueBubbles plugin) the iMessage simulator's
/// cross-check drives; BlueBubbles publishes no Python client of its own.
const ELIZAOS_BLUEBUBBLES: PythonTool = PythonTool {
    venv: "elizaos-plugin-bluebubbles",
    package: "elizaos-plugin-bluebubbles",
    version: "2.0.0a5",
    for_what: "the iMessage simulator's elizaos-plugin-bluebubbles test (or point \
               CLAWGATE_BLUEBUBBLES_PYTHON at a python that has elizaos-plugin-bluebubbles)",
};

/// The signal-cli JSON-RPC client the Signal simulator's cross-check is written against (it
/// imports python-magic, which needs the system's libmagic).
const PYSIGNALCLIJSONRPC: PythonTool = PythonTool {
    venv: "pysignalclijsonrpc",
    package: "pysignalclijsonrpc",
    version: "25.9.0",
    for_what: "the Signal simulator's pysignalclijsonrpc test (or point \
               CLAWGATE_PYSIGNALCLIJSONRPC_PYTHON at a python that has pysignalclijsonrpc)",
};

/// The synochat the Synology Chat simulator's cross-check is written against.
const SYNOCHAT: PythonTool = PythonTool {
    venv: "synochat",
    package: "synochat",
    version: "1.0.4",
    for_what: "the Synology Chat simulator's synochat test (or point CLAWGATE_SYNOCHAT_PYTHON \
               at a python that has synochat)",
};

/// Microsoft's Bot Builder (its Bot Connector client and its JWT validation) the Teams
/// simulator's cross-check uses.
const BOTBUILDER: NpmTool = NpmTool {
    dir: "botbuilder",
    packages: &["botbuilder@4.23.3", "botframework-connector@4.23.3"],
    for_what: "the Teams simulator's Bot Builder test (or point CLAWGATE_BOTBUILDER_MODULES at a \
               node_modules with botbuilder and botframework-connector)",
};

/// Feishu's official SDK the Feishu simulator's cross-check is written against.
const LARK_OAPI: PythonTool = PythonTool {
    venv: "lark-oapi",
    package: "lark-oapi",
    version: "1.7.5",
    for_what: "the Feishu simulator's lark-oapi test (or point CLAWGATE_LARK_OAPI_PYTHON at a \
               python that has lark-oapi)",
};

/// Tencent's own Python SDK for QQ bots, the QQ simulator's cross-check client.
const QQ_BOTPY: PythonTool = PythonTool {
    venv: "qq-botpy",
    package: "qq-botpy",
    version: "1.2.1",
    for_what: "the QQ simulator's qq-botpy test (or point CLAWGATE_QQ_BOTPY_PYTHON at a python \
               that has qq-botpy)",
};

/// Nextcloud's own Python framework, whose Talk client and TalkBot the Nextcloud Talk
/// simulator's cross-check drives.
const NC_PY_API: PythonTool = PythonTool {
    venv: "nc-py-api",
    package: "nc-py-api",
    version: "0.30.3",
    for_what: "the Nextcloud Talk simulator's nc-py-api test (or point CLAWGATE_NCPYAPI_PYTHON \
               at a python that has nc-py-api)",
};

/// Each Python tool, with the variable that points its tests at a python of one's own instead
/// (none for Synapse).
const PYTHON_TOOLS: &[(&PythonTool, Option<&str>)] = &[
    (&AIOGRAM, Some("CLAWGATE_AIOGRAM_PYTHON")),
    (&SLACK_SDK, Some("CLAWGATE_SLACK_SDK_PYTHON")),
    (&MATTERMOSTDRIVER, Some("CLAWGATE_MATTERMOSTDRIVER_PYTHON")),
    (&GOOGLE_APPS_CHAT, Some("CLAWGATE_GOOGLE_CHAT_PYTHON")),
    (&LINE_BOT_SDK, Some("CLAWGATE_LINE_BOT_SDK_PYTHON")),
    (&PYWA, Some("CLAWGATE_PYWA_PYTHON")),
    (&ELIZAOS_ZALO, Some("CLAWGATE_ZALO_PYTHON")),
    (
        &PYSIGNALCLIJSONRPC,
        Some("CLAWGATE_PYSIGNALCLIJSONRPC_PYTHON"),
    ),
    (&SYNOCHAT, Some("CLAWGATE_SYNOCHAT_PYTHON")),
    (&LARK_OAPI, Some("CLAWGATE_LARK_OAPI_PYTHON")),
    (&ELIZAOS_BLUEBUBBLES, Some("CLAWGATE_BLUEBUBBLES_PYTHON")),
    (&QQ_BOTPY, Some("CLAWGATE_QQ_BOTPY_PYTHON")),
    (&NC_PY_API, Some("CLAWGATE_NCPYAPI_PYTHON")),
    (&SYNAPSE, None),
];

/// Tlon's own Eyre client (and its atom library for writ ids) the Tlon simulator's cross-check
/// drives.
const URBIT_HTTP_API: NpmTool = NpmTool {
    dir: "urbit-http-api",
    packages: &["@urbit/http-api@3.0.0", "@urbit/aura@3.0.0"],
    for_what: "the Tlon simulator's @urbit/http-api test (or point \
               CLAWGATE_URBIT_HTTP_API_MODULES at a node_modules with @urbit/http-api and \
               @urbit/aura)",
};

/// zca-js, the unofficial Zalo Web client the Zalo Personal simulator's cross-check runs.
const ZCAJS: NpmTool = NpmTool {
    dir: "zca-js",
    packages: &["zca-js@2.2.0"],
    for_what: "the Zalo Personal simulator's zca-js cross-check (or point CLAWGATE_ZCAJS_DIR \
               at a directory with node_modules/zca-js)",
};

/// Real ACP agents the gateway's agent tests run offline (they start, handshake and refuse or
/// retry without a network): Codex's adapter (its linux-x64 binary comes as an optional
/// dependency) and Claude Code's.
const ACP_AGENTS: NpmTool = NpmTool {
    dir: "acp-agents",
    packages: &[
        "@zed-industries/codex-acp@0.16.0",
        "@zed-industries/claude-code-acp@0.16.2",
    ],
    for_what: "the gateway's tests with real ACP agents (or point CLAWGATE_ACP_AGENTS_DIR at a \
               directory with node_modules/@zed-industries/codex-acp and claude-code-acp)",
};

/// Each npm tool, with the variable that points its tests at a directory of one's own instead.
const NPM_TOOLS: &[(&NpmTool, Option<&str>)] = &[
    (&NOSTR_TOOLS, None),
    (&DISCORDJS, Some("CLAWGATE_DISCORDJS_MODULES")),
    (&TMIJS, Some("CLAWGATE_TMIJS_DIR")),
    (&TWURPLE, Some("CLAWGATE_TWURPLE_DIR")),
    (&BOTBUILDER, Some("CLAWGATE_BOTBUILDER_MODULES")),
    (&URBIT_HTTP_API, Some("CLAWGATE_URBIT_HTTP_API_MODULES")),
    (&ZCAJS, Some("CLAWGATE_ZCAJS_DIR")),
    (&ACP_AGENTS, Some("CLAWGATE_ACP_AGENTS_DIR")),
];

/// Whether a tool is wanted: no variable points at one of the developer's own.
fn wanted(overridden_by: Option<&str>) -> bool {
    overridden_by.is_none_or(|name| std::env::var_os(name).is_none())
}

/// Installs what is missing, in independent lanes at once (the installs mostly wait on the
/// network and the disk): cargo-deny's build, Debian's packages (one apt at a time), each Python
/// venv, and the npm packages. Every lane runs to its end; the errors are reported together.
pub(crate) fn ensure_test_tools() -> anyhow::Result<()> {
    type Lane<'a> = Box<dyn FnOnce() -> anyhow::Result<()> + Send + 'a>;
    let mut lanes: Vec<Lane<'_>> = vec![
        Box::new(|| {
            if !succeeds(&mut cargo(["deny", "--version"])) {
                println!("setup: installing {CARGO_DENY} (once per machine)");
                // Its release profile (fat LTO, one codegen unit) builds slowly on two cores;
                // built at opt-level 1 without them, `deny check` took as long here (3 s).
                let mut install = cargo(["install", "--locked", CARGO_DENY]);
                install.envs([
                    ("CARGO_PROFILE_RELEASE_LTO", "false"),
                    ("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "256"),
                    ("CARGO_PROFILE_RELEASE_OPT_LEVEL", "1"),
                ]);
                run_command(&mut install)?;
            }
            Ok(())
        }),
        Box::new(|| {
            let custom_driver = std::env::var_os("CLAWGATE_CHROMEDRIVER").is_some();
            if !custom_driver && !Path::new(CHROMEDRIVER).exists() {
                install_chromium()?;
            }
            if !Path::new(NGIRCD).exists() {
                install_irc_server("ngircd", NGIRCD)?;
            }
            if !Path::new(INSPIRCD).exists() {
                install_irc_server("inspircd", INSPIRCD)?;
            }
            Ok(())
        }),
        Box::new(|| {
            for &(tool, overridden_by) in NPM_TOOLS {
                if wanted(overridden_by) {
                    ensure_npm_tool(tool)?;
                }
            }
            Ok(())
        }),
    ];
    for &(tool, overridden_by) in PYTHON_TOOLS {
        if wanted(overridden_by) {
            lanes.push(Box::new(move || ensure_python_tool(tool)));
        }
    }
    let errors: Vec<anyhow::Error> = std::thread::scope(|scope| {
        let running: Vec<_> = lanes.into_iter().map(|lane| scope.spawn(lane)).collect();
        running
            .into_iter()
            .filter_map(|lane| match lane.join() {
                Ok(result) => result.err(),
                Err(_) => Some(anyhow::anyhow!("an installation lane panicked")),
            })
            .collect()
    });
    match errors.as_slice() {
        [] => Ok(()),
        [one] => bail!("{one:#}"),
        many => bail!(
            "{} installations failed:\n{}",
            many.len(),
            many.iter()
                .map(|e| format!("- {e:#}"))
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
}

/// The target directory the tests are built into.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| project_root().join("target"))
}

/// `<target>/python/<venv>`.
fn venv_dir(tool: &PythonTool) -> PathBuf {
    target_dir().join("python").join(tool.venv)
}

/// `npm install <package@version>…` into `<target>/node/<dir>`, unless each package's
/// `package.json` there already names its pinned version.
fn ensure_npm_tool(tool: &NpmTool) -> anyhow::Result<()> {
    let dir = target_dir().join("node").join(tool.dir);
    let installed = |spec: &str| {
        let (name, version) = spec.rsplit_once('@').unwrap_or((spec, ""));
        std::fs::read_to_string(dir.join("node_modules").join(name).join("package.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .is_some_and(|manifest| manifest["version"] == version)
    };
    if tool.packages.iter().all(|p| installed(p)) {
        return Ok(());
    }
    println!(
        "setup: installing {} into {} (once per machine)",
        tool.packages.join(" "),
        dir.display()
    );
    if !succeeds(Command::new("npm").arg("--version")) {
        bail!(
            "npm (Node.js 20 or later) is needed for {}: install nodejs and npm \
             (apt-get install nodejs npm)",
            tool.for_what
        );
    }
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("package.json"),
        format!(
            "{{\"name\": \"clawgate-{}\", \"private\": true}}\n",
            tool.dir
        ),
    )?;
    run_command(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--save-exact"])
            .args(tool.packages)
            .current_dir(&dir),
    )?;
    if !tool.packages.iter().all(|p| installed(p)) {
        bail!(
            "npm installed {} into {} but their versions do not match",
            tool.packages.join(" "),
            dir.display()
        );
    }
    Ok(())
}

/// `python3 -m venv` + `pip install <package>==<version>`, unless the venv already has that
/// version.
fn ensure_python_tool(tool: &PythonTool) -> anyhow::Result<()> {
    let venv = venv_dir(tool);
    let python = venv.join("bin").join("python");
    let probe = format!(
        "import sys, importlib.metadata as m; sys.exit(m.version({:?}) != {:?})",
        tool.package, tool.version
    );
    if succeeds(Command::new(&python).args(["-c", &probe])) {
        return Ok(());
    }
    println!(
        "setup: installing {}=={} into {} (once per machine)",
        tool.package,
        tool.version,
        venv.display()
    );
    if !succeeds(Command::new("python3").args(["-c", "import venv, ensurepip"])) {
        bail!(
            "python3 with the venv and ensurepip modules is needed for {}: install python3 and \
             python3-venv (apt-get install python3-venv)",
            tool.for_what
        );
    }
    run_command(
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
    )?;
    run_command(Command::new(&python).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &format!("{}=={}", tool.package, tool.version),
    ]))?;
    if !succeeds(Command::new(&python).args(["-c", &probe])) {
        bail!(
            "pip installed {}=={} into {} but its python cannot import it",
            tool.package,
            tool.version,
            venv.display()
        );
    }
    Ok(())
}

/// `apt-get install chromium chromium-driver`, as root or through sudo.
fn install_chromium() -> anyhow::Result<()> {
    println!("setup: installing Debian's chromium and chromium-driver (once per machine)");
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
    let apt = |args: &[&str]| {
        let mut command = if root {
            Command::new("apt-get")
        } else {
            let mut sudo = Command::new("sudo");
            sudo.arg("apt-get");
            sudo
        };
        command.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        command
    };
    if !root && !succeeds(Command::new("sudo").arg("-n").arg("true")) {
        bail!(
            "{CHROMEDRIVER} is missing and this user cannot install packages: install Debian's \
             chromium and chromium-driver (apt-get install chromium chromium-driver), or point \
             CLAWGATE_CHROMEDRIVER and CLAWGATE_CHROMIUM at a chromedriver and a Chromium"
        );
    }
    // A stale or partly unreachable package index may still hold these packages: try anyway.
    if let Err(error) = run_command(&mut apt(&["update", "-qq"])) {
        println!(
            "setup: apt-get update failed ({error:#}); trying the install with the current index"
        );
    }
    run_command(&mut apt(&[
        "install",
        "-y",
        "-qq",
        "chromium",
        "chromium-driver",
    ]))?;
    if !Path::new(CHROMEDRIVER).exists() {
        bail!("apt-get installed chromium-driver but {CHROMEDRIVER} is still missing");
    }
    Ok(())
}

/// `apt-get install <package>`, as root or through sudo (an IRC channel's test server; the
/// tests start their own on a free port, so a system service the package starts is stopped).
fn install_irc_server(package: &str, binary: &str) -> anyhow::Result<()> {
    println!("setup: installing Debian's {package} (once per machine)");
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
    if !root && !succeeds(Command::new("sudo").arg("-n").arg("true")) {
        bail!(
            "{binary} is missing and this user cannot install packages: install Debian's \
             {package} (apt-get install {package}) for the IRC channel's tests"
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
    let apt = |args: &[&str]| as_root("apt-get", args);
    if let Err(error) = run_command(&mut apt(&["update", "-qq"])) {
        println!(
            "setup: apt-get update failed ({error:#}); trying the install with the current index"
        );
    }
    run_command(&mut apt(&["install", "-y", "-qq", package]))?;
    if !Path::new(binary).exists() {
        bail!("apt-get installed {package} but {binary} is still missing");
    }
    // Where an init system started the package's service, stop it and keep it off (best
    // effort: a container without one started nothing).
    if Path::new("/run/systemd/system").exists() {
        let _ = succeeds(&mut as_root("systemctl", &["disable", "--now", package]));
    } else if Path::new(&format!("/etc/init.d/{package}")).exists() {
        let _ = succeeds(&mut as_root("update-rc.d", &[package, "disable"]));
        let _ = succeeds(&mut as_root(&format!("/etc/init.d/{package}"), &["stop"]));
    }
    Ok(())
}
