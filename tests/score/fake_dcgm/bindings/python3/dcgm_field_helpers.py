"""FAKE of DCGM's ``dcgm_field_helpers`` module (the field-value collection), for tests:
DCGM cannot exist here. Same class and method names as the documented bindings; a blank
is what the real helper calls one (non-OK status or a dcgmvalue sentinel)."""

import dcgm_agent
import dcgm_fields
import dcgm_structs
import dcgmvalue


class DcgmFieldValue:
    def __init__(self, rawValue):
        self.ts = rawValue.ts
        self.fieldId = rawValue.fieldId
        self.fieldType = chr(rawValue.fieldType)
        self.isBlank = False
        self.value = None
        if rawValue.status != dcgm_structs.DCGM_ST_OK:
            self.isBlank = True
            return
        if self.fieldType == dcgm_fields.DCGM_FT_DOUBLE:
            self.value = float(rawValue.value.dbl)
            self.isBlank = dcgmvalue.DCGM_FP64_IS_BLANK(self.value)
        elif self.fieldType in (dcgm_fields.DCGM_FT_INT64, dcgm_fields.DCGM_FT_TIMESTAMP):
            self.value = int(rawValue.value.i64)
            self.isBlank = dcgmvalue.DCGM_INT64_IS_BLANK(self.value)
        elif self.fieldType == dcgm_fields.DCGM_FT_STRING:
            self.value = str(rawValue.value.str)
            self.isBlank = dcgmvalue.DCGM_STR_IS_BLANK(self.value)


class DcgmFieldValueTimeSeries:
    def __init__(self):
        self.values = []

    def __len__(self):
        return len(self.values)

    def __getitem__(self, key):
        return self.values[key]

    def InsertValue(self, value):
        self.values.append(value)
        self.values.sort(key=lambda v: v.ts)


def _on_values(entityGroupId, entityId, values, numValues, userData):
    userData._ProcessValues(entityGroupId, entityId, values[0:numValues])
    return 0


helper_dcgm_field_values_since_entity_callback = dcgm_agent.dcgmFieldValueEntityEnumeration_f(_on_values)


class DcgmFieldValueEntityCollection:
    def __init__(self, handle, groupId):
        self.values = {}            # [entityGroupId][entityId][fieldId] -> DcgmFieldValueTimeSeries
        self._handle = handle
        self._groupId = groupId
        self._numValuesSeen = 0
        self._nextSinceTimestamp = 0

    def _ProcessValues(self, entityGroupId, entityId, values):
        self._numValuesSeen += len(values)
        fields = self.values.setdefault(entityGroupId, {}).setdefault(entityId, {})
        for raw in values:
            v = DcgmFieldValue(raw)
            fields.setdefault(v.fieldId, DcgmFieldValueTimeSeries()).InsertValue(v)

    def GetAllSinceLastCall(self, fieldGroup):
        before = self._numValuesSeen
        self._nextSinceTimestamp = dcgm_agent.dcgmGetValuesSince_v2(
            self._handle, self._groupId, fieldGroup.fieldGroupId, self._nextSinceTimestamp,
            helper_dcgm_field_values_since_entity_callback, self)
        return self._numValuesSeen - before

    def EmptyValues(self):
        self.values = {}
        self._numValuesSeen = 0
