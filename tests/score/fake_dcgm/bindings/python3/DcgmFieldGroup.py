"""FAKE of DCGM's ``DcgmFieldGroup`` class, for tests: DCGM cannot exist here."""

import dcgm_agent


class DcgmFieldGroup:
    def __init__(self, dcgmHandle, name="", fieldIds=None, fieldGroupId=None):
        self.name = name
        self.fieldIds = list(fieldIds or [])
        self._dcgmHandle = dcgmHandle
        self.fieldGroupId = fieldGroupId
        if fieldGroupId is None:
            self.fieldGroupId = dcgm_agent.dcgmFieldGroupCreate(dcgmHandle.handle, self.fieldIds, name)

    def Delete(self):
        if self.fieldGroupId is not None:
            dcgm_agent.dcgmFieldGroupDestroy(self._dcgmHandle.handle, self.fieldGroupId)
        self.fieldGroupId = None
        self._dcgmHandle = None
