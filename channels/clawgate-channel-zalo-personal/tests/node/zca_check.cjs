// zca-js 2.2.0 pointed at the Zalo Web simulator: it logs in with the account's cookies, IMEI
// and user agent, opens its listener (selfListen on), sends a text to a person and to a group,
// and reports, one JSON object per line on stdout, what it sees: its sends' msgIds, the
// listener's messages (our own echoes with their cliMsgId, a person's message) and the close
// code when another session takes over.
//
// zca-js hard-codes its login host (https://wpa.chat.zalo.me); the other hosts come from the
// login's service map (here Zalo-like https://…zalo.me hosts, since zca-js's cookie jar only
// sends the zalo.me cookies to zalo.me hosts) and zpw_ws (the simulator's own ws:// URL).
// zca-js takes its fetch from the `polyfill` option, so the only change is a fetch wrapper
// that sends requests for https://*.zalo.me to the simulator. zca-js itself is not patched.
//
// Environment: SIM_URL (http://127.0.0.1:<port>), SIM_COOKIE (zpw_sek=…), SIM_IMEI, SIM_UA,
// SIM_PERSON, SIM_GROUP.

const { Zalo, ThreadType } = require("zca-js");

const sim = process.env.SIM_URL;
const out = (event) => process.stdout.write(JSON.stringify(event) + "\n");

const polyfill = (url, options) =>
    fetch(String(url).replace(/^https:\/\/[a-z0-9.-]+\.zalo\.me/, sim), options);

// The cookie header as a browser extension exports cookies (domain .zalo.me).
const cookies = process.env.SIM_COOKIE.split(";").map((pair) => {
    const [name, ...rest] = pair.trim().split("=");
    return { name, value: rest.join("="), domain: ".zalo.me", path: "/" };
});

async function main() {
    const zalo = new Zalo({ selfListen: true, checkUpdate: false, logging: false, polyfill });
    let api;
    try {
        api = await zalo.login({ cookie: cookies, imei: process.env.SIM_IMEI, userAgent: process.env.SIM_UA });
    } catch (error) {
        out({ event: "login_failed", error: String(error && error.message) });
        process.exit(0);
    }
    out({ event: "logged_in", uid: api.getOwnId ? api.getOwnId() : null });
    api.listener.on("message", (m) => {
        out({
            event: "message",
            self: m.isSelf,
            type: m.type === ThreadType.Group ? "group" : "user",
            threadId: String(m.threadId),
            msgId: String(m.data.msgId),
            cliMsgId: String(m.data.cliMsgId),
            uidFrom: String(m.data.uidFrom),
            content: m.data.content,
        });
    });
    api.listener.on("error", (e) => out({ event: "error", error: String(e && e.message) }));
    api.listener.on("closed", (code) => {
        out({ event: "closed", code });
        process.exit(0);
    });
    api.listener.on("connected", async () => {
        out({ event: "connected" });
        // Wait for the cipher key before sending, so the echoes can be read.
        await new Promise((resolve) => api.listener.once("cipher_key", resolve));
        const user = await api.sendMessage("hello from zca-js", process.env.SIM_PERSON, ThreadType.User);
        out({ event: "sent", type: "user", msgId: String(user.message.msgId) });
        const group = await api.sendMessage({ msg: "group hello from zca-js" }, process.env.SIM_GROUP, ThreadType.Group);
        out({ event: "sent", type: "group", msgId: String(group.message.msgId) });
    });
    api.listener.start();
}

main().catch((error) => {
    out({ event: "fatal", error: String(error && error.stack) });
    process.exit(1);
});
