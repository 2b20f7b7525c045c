"""Obtains access tokens from the Google Chat simulator's token endpoint with google-auth's own
service account credentials (google.oauth2.service_account: the assertion it signs, the form it
posts, the answer it parses), uses one with google-apps-chat, and checks that a key the endpoint
does not know is refused as Google refuses it. Every assertion here is the calling Rust test's."""

import datetime
import json
import os

import google.auth.exceptions
import google.auth.transport.requests
import google.oauth2.credentials
from google.api_core.client_options import ClientOptions
from google.apps import chat_v1
from google.oauth2 import service_account

SCOPES = ["https://www.googleapis.com/auth/chat.bot"]
info = json.loads(os.environ["SIM_KEY"])
assert info["token_uri"] == os.environ["SIM_TOKEN_URI"], info["token_uri"]
request = google.auth.transport.requests.Request()

credentials = service_account.Credentials.from_service_account_info(info, scopes=SCOPES)
assert not credentials.valid
credentials.refresh(request)
assert credentials.valid, "no token after refresh"
assert credentials.token.startswith("ya29."), credentials.token
# expires_in became an expiry about the configured lifetime away (google-auth takes a margin).
left = credentials.expiry - datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
assert datetime.timedelta(minutes=50) < left <= datetime.timedelta(hours=1), left

# The token works with Google's own Chat client. (Handed the service account credentials
# themselves, the generated client would sign a self-signed JWT as its bearer instead of using
# the token endpoint; the simulator accepts only tokens it issued.)
client = chat_v1.ChatServiceClient(
    credentials=google.oauth2.credentials.Credentials(token=credentials.token),
    transport="rest",
    client_options=ClientOptions(api_endpoint=os.environ["SIM_API_URL"].rstrip("/")),
)
sent = client.create_message(
    chat_v1.CreateMessageRequest(
        parent=os.environ["SIM_SPACE"], message=chat_v1.Message(text="as a service account")
    )
)
assert sent.text == "as a service account", sent

# An account the endpoint does not know: invalid_grant, not retryable.
stranger = dict(info, client_email="stranger@elsewhere.iam.gserviceaccount.com")
try:
    service_account.Credentials.from_service_account_info(stranger, scopes=SCOPES).refresh(request)
    raise AssertionError("an unknown account got a token")
except google.auth.exceptions.RefreshError as error:
    assert "invalid_grant" in str(error), error
    assert not error.retryable, error

print("service account token obtained and used, checks passed")
