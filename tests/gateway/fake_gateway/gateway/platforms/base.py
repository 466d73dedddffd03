"""Platform adapters: what hooks like to wrap."""


class BasePlatformAdapter:
    name = "base"

    def __init__(self):
        self.outbox = []

    async def send(self, chat_id, text):
        self.outbox.append((chat_id, text))
        return text


class FakeChatAdapter(BasePlatformAdapter):
    name = "fakechat"
