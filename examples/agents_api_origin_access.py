# The hosted-browser origin-access sample (Python), run against `desktop-sandbox serve`. Changed from
# the original: how the client is made (base_url and key of the local server, from the environment)
# and the model (an offline task: no OpenAI key is needed). Everything else is the sample's own.
#
#   desktop-sandbox serve --attach-network ds-origin-demo      # prints agents-api: URL key-file: PATH
#   DESKTOP_SANDBOX_AGENTS_URL=URL DESKTOP_SANDBOX_AGENTS_KEY_FILE=PATH python examples/agents_api_origin_access.py
import base64
import os
from pathlib import Path
from openai import OpenAI

client = OpenAI(
    base_url=os.environ["DESKTOP_SANDBOX_AGENTS_URL"],
    api_key=Path(os.environ["DESKTOP_SANDBOX_AGENTS_KEY_FILE"]).read_text().strip(),
)
session = client.beta.agents.sessions.create(
    agent={
        "model": os.environ.get("DESKTOP_SANDBOX_AGENTS_MODEL", "offline:tasks/origin-demo.toml"),
        "instructions": "Read public documentation in the browser. Do not sign in or change any website data. Report the page title and URL you find.",
        "tools": [{"type": "computer_use", "include_screenshots": True}],
    },
    environment={
        "type": "openai_hosted",
        "desktop": {"enabled": True},
        "network": {"access": "enabled"},
    },
)
print("Session ID:", session.id, flush=True)
ready_to_delete = False


def respond_to_origin_approval(client, session_id, approval):
    request = approval.request
    if request.type == "browser_origin_access":
        print(request.reason or "The browser needs access to an origin.")
        print("Origin:", request.origin)
        while True:
            decision = (
                input("Allow this origin? [approve/deny/cancel; default: deny] ")
                .strip()
                .lower()
                or "deny"
            )
            if decision in {"approve", "deny", "cancel"}:
                break
            print("Enter approve, deny, or cancel.")
        response = {"type": "browser_origin_access", "decision": decision}
    elif request.type == "browser_authentication":
        print("This public-page task does not sign in; cancelling the request.")
        response = {"type": "browser_authentication", "action": "cancel"}
    else:
        raise RuntimeError(f"Unsupported computer-use approval: {request.type}")

    client.beta.agents.sessions.events.create(
        session_id,
        events=[
            {
                "type": "agent.session.input.computer_use_approval_request_result",
                "request_id": approval.request_id,
                "response": response,
            }
        ],
    )


try:
    last_screenshot = None
    handled_requests = set()
    completed = False
    with client.beta.agents.sessions.events.stream(session.id) as events:
        client.beta.agents.sessions.events.create(
            session.id,
            events=[
                {
                    "type": "agent.session.input.message",
                    "input": [
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "input_text",
                                    "text": "Open https://developers.openai.com in the browser. Find the Agents API quickstart, then report its page title and URL.",
                                }
                            ],
                        }
                    ],
                }
            ],
        )
        for event in events:
            if event.type == "agent.session.requires_action":
                current = client.beta.agents.sessions.retrieve(session.id)
                for approval in current.required_actions:
                    if (
                        approval.type == "computer_use_approval_request"
                        and approval.request_id not in handled_requests
                    ):
                        respond_to_origin_approval(client, session.id, approval)
                        handled_requests.add(approval.request_id)
            elif event.type == "agent.session.turn.item.done":
                # Preserve streamed screenshots; retrieved history may omit image bytes.
                item = event.item
                if item.type == "computer_use_call":
                    output = getattr(item, "output", None)
                    if output is not None and output.type == "computer_screenshot":
                        prefix = "data:image/jpeg;base64,"
                        if output.image_url.startswith(prefix):
                            last_screenshot = base64.b64decode(
                                output.image_url[len(prefix) :], validate=True
                            )
            elif event.type == "agent.session.turn.output_text.done":
                print(event.text, flush=True)
            elif event.type == "agent.session.turn.completed":
                if event.turn.subagent_id is None:
                    completed = True
                    print()
                    break
            elif event.type in {
                "agent.session.turn.failed",
                "agent.session.turn.cancelled",
            }:
                if event.turn.subagent_id is None:
                    raise RuntimeError(f"Browser task ended: {event.type}")
            elif event.type == "error":
                raise RuntimeError(event.error.message)
            elif event.type in {
                "agent.session.failed",
                "agent.session.environment.failed",
            }:
                raise RuntimeError(f"Session failed: {event.type}")
        else:
            raise RuntimeError("Stream closed before the browser task finished.")

    for item in client.beta.agents.sessions.items.list(
        session.id, order="asc", limit=100
    ):
        if item.type != "computer_use_call":
            continue
        print(item.title or "Browser activity", item.status)

    if last_screenshot is not None:
        screenshot_path = Path("browser-screenshot.jpg")
        descriptor = os.open(
            screenshot_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600
        )
        with os.fdopen(descriptor, "wb") as screenshot_file:
            screenshot_file.write(last_screenshot)
        print("Saved screenshot:", screenshot_path)
    else:
        print("No screenshot was returned.")
    ready_to_delete = completed
except (Exception, KeyboardInterrupt):
    print(
        f"Session {session.id} was kept. Use the same ID to check its status before trying again.",
        flush=True,
    )
    raise
finally:
    if ready_to_delete:
        client.beta.agents.sessions.delete(session.id)
    client.close()
