"""`/ws/events`: routing events (cooldowns, hops, quota transitions) for staff."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

EVENTS_GROUP = "ocx-events"


class EventsConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not getattr(user, "is_staff", False):
            await self.close(code=4403)
            return
        await self.channel_layer.group_add(EVENTS_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(EVENTS_GROUP, self.channel_name)

    async def ocx_event(self, message: dict[str, Any]) -> None:
        await self.send_json(message["event"])
