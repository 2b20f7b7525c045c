"""Drives the Google Chat simulator with Google's own generated client (google-apps-chat, REST
transport) and checks the simulator's event tokens with google-auth's verify_token against its
x509 certificate URL. Every assertion here is the calling Rust test's."""

import json
import os

import google.auth.transport.requests
import google.oauth2.credentials
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.apps import chat_v1
from google.oauth2 import id_token
from google.protobuf import field_mask_pb2

API = os.environ["SIM_API_URL"].rstrip("/")
SPACE = os.environ["SIM_SPACE"]
THREAD = os.environ["SIM_THREAD"]

client = chat_v1.ChatServiceClient(
    credentials=google.oauth2.credentials.Credentials(token=os.environ["SIM_TOKEN"]),
    transport="rest",
    client_options=ClientOptions(api_endpoint=API),
)

# requestId: the same request answers the same message.
first = client.create_message(
    chat_v1.CreateMessageRequest(
        parent=SPACE,
        message=chat_v1.Message(text="from google-apps-chat"),
        request_id="py-request-1",
        message_id="client-py-1",
    )
)
assert first.name == f"{SPACE}/messages/client-py-1", first.name
assert first.client_assigned_message_id == "client-py-1"
again = client.create_message(
    chat_v1.CreateMessageRequest(
        parent=SPACE,
        message=chat_v1.Message(text="from google-apps-chat"),
        request_id="py-request-1",
        message_id="client-py-1",
    )
)
assert again.name == first.name

# The same client id under another request: ALREADY_EXISTS.
try:
    client.create_message(
        chat_v1.CreateMessageRequest(
            parent=SPACE,
            message=chat_v1.Message(text="twice"),
            request_id="py-request-2",
            message_id="client-py-1",
        )
    )
    raise AssertionError("a reused client id was accepted")
except exceptions.Conflict as error:
    # api_core names HTTP exceptions by status code (409: Conflict); the body says which.
    assert error.response.json()["error"]["status"] == "ALREADY_EXISTS", error.response.text

# A reply into the person's thread, with the client's enum encoding of the reply option.
reply = client.create_message(
    chat_v1.CreateMessageRequest(
        parent=SPACE,
        message=chat_v1.Message(text="in the thread", thread=chat_v1.Thread(name=THREAD)),
        message_reply_option=chat_v1.CreateMessageRequest.MessageReplyOption.REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD,
    )
)
assert reply.thread.name == THREAD, reply.thread.name
assert reply.thread_reply

# Get by the client id, a 404 for one that never landed.
got = client.get_message(name=f"{SPACE}/messages/client-py-1")
assert got.text == "from google-apps-chat"
try:
    client.get_message(name=f"{SPACE}/messages/client-never")
    raise AssertionError("a message that never landed was found")
except exceptions.NotFound:
    pass

# Patch with an update mask.
edited = client.update_message(
    chat_v1.UpdateMessageRequest(
        message=chat_v1.Message(name=first.name, text="edited by google-apps-chat"),
        update_mask=field_mask_pb2.FieldMask(paths=["text"]),
    )
)
assert edited.text == "edited by google-apps-chat"

# List, then delete the reply.
texts = [m.text for m in client.list_messages(parent=SPACE)]
assert "edited by google-apps-chat" in texts and "in the thread" in texts, texts
client.delete_message(name=reply.name)
try:
    client.get_message(name=reply.name)
    raise AssertionError("a deleted message was found")
except exceptions.NotFound:
    pass

# Permission: a person's message is not the app's to delete.
try:
    client.delete_message(name=os.environ["SIM_PERSON_MESSAGE"])
    raise AssertionError("the app deleted a person's message")
except exceptions.Forbidden:  # HTTP 403, PERMISSION_DENIED in the body
    pass

# The event tokens, as google-auth verifies Chat's.
request = google.auth.transport.requests.Request()
audience = os.environ["SIM_AUDIENCE"]
with open(os.environ["SIM_DELIVERIES"]) as f:
    deliveries = json.load(f)
assert deliveries, "no deliveries captured"
for delivery in deliveries:
    claims = id_token.verify_token(
        delivery["token"], request, audience=audience, certs_url=os.environ["SIM_CERTS_URL"]
    )
    assert claims["iss"] == "chat@system.gserviceaccount.com", claims
    assert delivery["user_agent"] == "Google-Dynamite", delivery["user_agent"]
    event = json.loads(delivery["body"])
    assert event["type"] in ("ADDED_TO_SPACE", "MESSAGE"), event["type"]
try:
    id_token.verify_token(
        deliveries[0]["token"], request, audience="another-project", certs_url=os.environ["SIM_CERTS_URL"]
    )
    raise AssertionError("a token for another audience verified")
except ValueError:
    pass

print(f"google-apps-chat and google-auth: {len(deliveries)} tokens verified, checks passed")
