"""The least privileges the library and the ``mongolock`` command need, for a custom role.

```python
await client.admin.command(
    "createRole", "mongolockUser", privileges=lock_privileges("mongolock", "locks"), roles=[]
)
```

Each action is what MongoDB's privilege reference ("Privilege Actions") requires of the commands
the library sends: ``findAndModify`` with ``upsert`` needs ``find``, ``update`` and ``insert``;
``update`` needs ``update``; ``find`` and ``aggregate`` need ``find``; a change stream needs
``changeStream`` and ``find``; ``delete`` needs ``remove``; ``getMore`` and ``killCursors`` of one's
own cursors need nothing.
"""

from .admin.privileges import lock_privileges, operator_privileges

__all__ = [
    "lock_privileges",
    "operator_privileges",
]
