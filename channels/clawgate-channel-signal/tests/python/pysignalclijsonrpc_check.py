"""Drives the signal-cli simulator's HTTP JSON-RPC endpoint with pysignalclijsonrpc.

The client was written against the real signal-cli daemon (`daemon --http`): it resolves
recipients with `listGroups` and `getUserStatus`, sends with `send` and reads the timestamps
and per-recipient results from the answer, and raises on JSON-RPC errors. Its assertions are
the test's; it prints what it saw as one JSON object for the Rust side to check against the
simulator's record.
"""

import json
import os
import sys

from pysignalclijsonrpc.api import SignalCliJSONRPCApi, SignalCliJSONRPCError

url = os.environ["SIM_RPC_URL"]
account = os.environ["SIM_ACCOUNT"]
person = os.environ["SIM_PERSON"]
group = os.environ["SIM_GROUP"]
untrusted = os.environ["SIM_UNTRUSTED"]

api = SignalCliJSONRPCApi(endpoint=url, account=account)
seen = {"version": api.version}

status = api.get_user_status(recipients=[person])
assert status[0]["isRegistered"] is True, status
assert status[0]["number"] == person, status

groups = api.list_groups()
assert [g["id"] for g in groups] == [group], groups

direct = api.send_message(recipients=[person], message="hello from pysignalclijsonrpc")
[(direct_ts, direct_to)] = direct["timestamps"].items()
assert direct_to["recipients"] == [person], direct
seen["direct"] = direct_ts

to_group = api.send_message(recipients=[group], message="hello group")
[(group_ts, group_to)] = to_group["timestamps"].items()
# The client reads a group send's recipients from each result's `groupId`.
assert group_to["recipients"] == [group], to_group
assert group_ts > direct_ts, (group_ts, direct_ts)
seen["group"] = group_ts

try:
    api.send_message(recipients=[untrusted], message="not for you")
    raise AssertionError("a send to an untrusted identity must raise")
except SignalCliJSONRPCError as err:
    assert "Untrusted Identity" in str(err), err
    seen["untrusted_error"] = str(err)

json.dump(seen, sys.stdout)
